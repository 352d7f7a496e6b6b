use dds_proto::Status;

/// An error from the library or the DPU: a stable [`Status`] code plus a message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct DdsError {
    pub status: Status,
    pub message: String,
}

impl DdsError {
    pub fn new(status: Status, message: impl Into<String>) -> DdsError {
        DdsError {
            status,
            message: message.into(),
        }
    }

    pub fn dead(why: impl std::fmt::Display) -> DdsError {
        DdsError::new(Status::DpuDead, format!("DPU connection lost: {why}"))
    }
}

pub type Result<T> = std::result::Result<T, DdsError>;
