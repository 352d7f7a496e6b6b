use dds_proto::Status;

/// An error from the library or the DPU: a stable [`Status`] code plus a message.
///
/// Displayed as the message alone when it already says what the status says (`unknown
/// directory`, not `unknown directory: unknown directory`), else as `status: message`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
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

    /// Nothing accepted a connection at the DPU's socket (no DPU was started there, it
    /// stopped, or it is not up yet).
    pub fn unreachable(socket: &std::path::Path, why: std::io::Error) -> DdsError {
        DdsError::new(
            Status::DpuDead,
            format!(
                "DPU unreachable: nothing accepts connections at {} ({why})",
                socket.display()
            ),
        )
    }
}

impl std::fmt::Display for DdsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = self.status.name();
        if self.message.is_empty() {
            f.write_str(name)
        } else if self.message.to_lowercase().contains(&name.to_lowercase()) {
            f.write_str(&self.message)
        } else {
            write!(f, "{name}: {}", self.message)
        }
    }
}

pub type Result<T> = std::result::Result<T, DdsError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn says_the_status_once() {
        let dup = DdsError::new(Status::UnknownDir, "unknown directory");
        assert_eq!(dup.to_string(), "unknown directory");
        let more = DdsError::new(Status::Io, "eventfd: too many open files");
        assert_eq!(more.to_string(), "I/O error: eventfd: too many open files");
        assert_eq!(
            DdsError::new(Status::NotEmpty, "").to_string(),
            "directory not empty"
        );
    }
}
