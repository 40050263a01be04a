"""The upgrade radar: releases read from the index, the gates each release sets, and what holds a move back."""
