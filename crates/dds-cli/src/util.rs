//! Small helpers shared by the subcommands.

pub use dds_proto::units::parse_size;
