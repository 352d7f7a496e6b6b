//! Applications that run on DDS. `pagestore` is the remote storage protocol of the paper's
//! evaluation (§8.1): clients send batches of file reads and writes over TCP.

pub mod pagestore;
