"""The ground floor: typed errors and their exit codes, credentials kept out of records, the file-model base and the Docker SDK client. Imports nothing else of cudastack."""
