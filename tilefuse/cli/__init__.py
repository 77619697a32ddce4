"""The `tilefuse` command line."""
