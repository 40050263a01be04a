"""What each task does, end to end, walking the layers below; the command line calls one function here."""
