//! The Redis serialization protocol, version 2 (RESP2), as a codec with no engine in it:
//! framing and parsing of client commands (multibulk arrays of bulk strings, and inline
//! commands), framing of server replies, and reply encoding. Shared by `dds kv`, its DPU
//! offload app and DPU-KV.
//!
//! Parsing borrows from the input and allocates nothing beyond the caller's argument list;
//! it never trusts a length before the bytes arrive: a declared bulk length is checked
//! against [`Limits`] and the command is complete only once all its bytes are in the buffer.
//! Protocol errors carry the text Redis sends for the same mistake.

#![warn(missing_docs)]

mod encode;
mod inline;
mod parse;
mod reply;
pub mod session;

pub use encode::{bulk_header_into, Reply};
pub use parse::{
    args, frame_command, parse_command, reuse, unquote_word, Args, Argv, Limits, ProtocolError,
};
pub use reply::frame_reply;

/// Most nested array levels [`frame_reply`] accepts.
pub const MAX_REPLY_DEPTH: usize = 16;
