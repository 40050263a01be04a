"""The Invoke tasks: parse and check flags, call one function of cudastack.jobs, map a StackError to its exit code."""
