"""stackprobe: the validation suite. Runs inside any image or GPU host with the standard library
(plus torch and whatever backend libraries are installed); no Docker, no invoke.

Entry point: ``python -m stackprobe --target-arch 12.0 --json report.json``.
"""
__version__ = "0.1.0"
REPORT_SCHEMA_VERSION = 4
