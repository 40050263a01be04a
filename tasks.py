"""Invoke entry point: the tasks of cudastack/cli/ (each parses its flags and calls one function of
cudastack/jobs/). `invoke --list` shows every task, `invoke --help TASK` its flags; the installed console script
`cudastack` runs the same tasks (`cudastack --version`)."""
from cudastack.cli.main import namespace

ns = namespace()
