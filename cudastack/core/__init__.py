"""The ground floor: typed errors and their exit codes, credentials kept out of records, the file-model base, the Docker SDK client and the project's paths. Imports nothing else of cudastack."""
