//! Access log lines formatted into per-thread buffers and written by a writer thread.
