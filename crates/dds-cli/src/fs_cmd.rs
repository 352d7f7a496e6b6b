//! `dds fs`: operator commands against a running DPU, through the host library.
//!
//! Exit codes (`crate::util::exit`): 0 success; 1 the DPU refused the operation (the status
//! is printed, and with `--json` given as `{"error": {"code", "status", "message", "command"}}`);
//! 2 usage; 3 the DPU is not reachable; 4 a local file error. A change prints what it did
//! (`-q`: nothing).

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use dds_host::{Dds, DdsError, EntryKind, Status};
use dds_proto::units::fmt_bytes;
use serde_json::json;

use crate::util::{connect_dpu, exit};

#[derive(Args)]
pub struct FsArgs {
    /// Control socket of the DPU.
    #[arg(long, default_value_os_t = dds_host::default_socket_path(), env = "DDS_SOCKET")]
    socket: PathBuf,
    /// Print machine-readable JSON.
    #[arg(long, global = true)]
    json: bool,
    /// Print nothing on success (errors still go to standard error).
    #[arg(short, long, global = true)]
    quiet: bool,
    #[command(subcommand)]
    cmd: FsCmd,
}

#[derive(Subcommand)]
enum FsCmd {
    /// List a directory ("/" is the root).
    Ls {
        #[arg(default_value = "/")]
        dir: String,
    },
    /// Show a file's id, path and size.
    Stat { path: String },
    /// Create a directory.
    Mkdir { path: String },
    /// Remove an empty directory.
    Rmdir { path: String },
    /// Copy a local file (or - for standard input) into DDS.
    Put { local: String, remote: String },
    /// Copy a DDS file to a local file (or - for standard output).
    Get { remote: String, local: String },
    /// Delete a file.
    Rm { path: String },
    /// Rename or move a file.
    Mv { from: String, to: String },
    /// Set a file's size.
    Truncate {
        path: String,
        #[arg(value_parser = crate::util::parse_size)]
        size: u64,
    },
    /// Show device capacity and free space.
    Df,
}

/// Bytes per read or write when copying files.
const CHUNK_BYTES: usize = 256 << 10;

enum Failure {
    Dds(DdsError),
    Local(String),
    Unreachable(String),
}

impl From<DdsError> for Failure {
    fn from(e: DdsError) -> Self {
        Failure::Dds(e)
    }
}

/// How a command's output goes: JSON, words, or nothing on success.
#[derive(Clone, Copy)]
struct Out {
    json: bool,
    quiet: bool,
}

impl Out {
    /// What a change did, in words (nothing with `-q`; `{"ok": true, ...}` with `--json`).
    fn done(self, words: impl FnOnce() -> String, fields: serde_json::Value) {
        if self.json {
            let mut v = json!({"ok": true});
            if let (Some(o), serde_json::Value::Object(f)) = (v.as_object_mut(), fields) {
                o.extend(f);
            }
            println!("{v}");
        } else if !self.quiet {
            println!("{}", words());
        }
    }
}

pub fn run(a: FsArgs) -> ExitCode {
    let out = Out {
        json: a.json,
        quiet: a.quiet,
    };
    let what = a.cmd.describe();
    let result = match connect_dpu(&a.socket) {
        Ok(dds) => execute(&dds, a.cmd, out),
        Err(f) => Err(Failure::Unreachable(f.message)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            report(out.json, &what, &f);
            ExitCode::from(match &f {
                Failure::Dds(e) if e.status == Status::DpuDead => exit::UNREACHABLE,
                Failure::Unreachable(_) => exit::UNREACHABLE,
                Failure::Dds(_) => exit::FAILED,
                Failure::Local(_) => exit::LOCAL,
            })
        }
    }
}

/// Prints a failure of the command `what` (`ls /nope`): the DPU's refusal names the command
/// and its path, says the status once and what to do about it.
fn report(json: bool, what: &str, f: &Failure) {
    match (json, f) {
        (true, Failure::Dds(e)) => println!(
            "{}",
            json!({"error": {"code": e.status.code(), "status": e.status.name(), "message": e.message, "command": what}})
        ),
        (true, Failure::Local(m)) => println!(
            "{}",
            json!({"error": {"code": null, "status": "local", "message": m, "command": what}})
        ),
        (true, Failure::Unreachable(m)) => println!(
            "{}",
            json!({"error": {"code": Status::DpuDead.code(), "status": Status::DpuDead.name(), "message": m, "command": what}})
        ),
        (false, Failure::Dds(e)) => match hint(e.status) {
            Some(h) => eprintln!("dds fs {what}: {e}\n  hint: {h}"),
            None => eprintln!("dds fs {what}: {e}"),
        },
        (false, Failure::Local(m) | Failure::Unreachable(m)) => eprintln!("dds fs: {m}"),
    }
}

impl FsCmd {
    /// The command as typed, for messages: `ls /nope`, `put pages.bin /db/pages`.
    fn describe(&self) -> String {
        match self {
            FsCmd::Ls { dir } => format!("ls {dir}"),
            FsCmd::Stat { path } => format!("stat {path}"),
            FsCmd::Mkdir { path } => format!("mkdir {path}"),
            FsCmd::Rmdir { path } => format!("rmdir {path}"),
            FsCmd::Put { local, remote } => format!("put {local} {remote}"),
            FsCmd::Get { remote, local } => format!("get {remote} {local}"),
            FsCmd::Rm { path } => format!("rm {path}"),
            FsCmd::Mv { from, to } => format!("mv {from} {to}"),
            FsCmd::Truncate { path, size } => format!("truncate {path} {size}"),
            FsCmd::Df => "df".into(),
        }
    }
}

/// What to do about a refusal, in words.
fn hint(status: Status) -> Option<&'static str> {
    Some(match status {
        Status::InvalidPath => {
            "paths are /name or /dir/name: directories are flat (one level below /) and names \
             have no control characters"
        }
        Status::UnknownDir => "the directory does not exist: create it with `dds fs mkdir /dir`",
        Status::NotFound => {
            "no such file (`dds fs ls /dir` lists a directory; directories are not files)"
        }
        Status::Exists => "the name is taken: pick another or remove it first",
        Status::NotEmpty => "remove the directory's files first (`dds fs rm /dir/name`)",
        Status::NoSpace => "the device is full: `dds fs df` shows the space, `dds fs rm` frees it",
        Status::NameTooLong => "shorten the name (`dds format --help` shows the limit)",
        Status::DpuDead => {
            "the DPU went away during the command: start it again (`dds dpu --device ...`)"
        }
        _ => return None,
    })
}

/// A progress bar on standard error for copies of at least 8 MiB, when it is a terminal.
fn copy_bar(bytes: Option<u64>) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    match bytes {
        Some(n) if n >= 8 << 20 && std::io::stderr().is_terminal() => {
            let bar = indicatif::ProgressBar::new(n);
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "{bar:40} {binary_bytes}/{binary_total_bytes} ({binary_bytes_per_sec}, {eta})",
            ) {
                bar.set_style(style);
            }
            bar
        }
        _ => indicatif::ProgressBar::hidden(),
    }
}

fn execute(dds: &Dds, cmd: FsCmd, out: Out) -> Result<(), Failure> {
    let json = out.json;
    match cmd {
        FsCmd::Ls { dir } => {
            let entries = dds.list_dir(&dir)?;
            if json {
                println!("{}", serde_json::to_string(&entries).expect("serializable"));
            } else {
                for e in entries {
                    match e.kind {
                        EntryKind::Dir => println!("d {:>10} {}/", "-", e.name),
                        EntryKind::File => println!("f {:>10} {}", fmt_bytes(e.size), e.name),
                    }
                }
            }
        }
        FsCmd::Stat { path } => {
            let info = dds.lookup(&path)?;
            if json {
                println!("{}", serde_json::to_string(&info).expect("serializable"));
            } else {
                println!(
                    "id {}  size {} ({} bytes)  path {}",
                    info.id,
                    fmt_bytes(info.size),
                    info.size,
                    info.path
                );
            }
        }
        FsCmd::Mkdir { path } => {
            dds.create_dir(&path)?;
            out.done(|| format!("created directory {path}"), json!({}));
        }
        FsCmd::Rmdir { path } => {
            dds.remove_dir(&path)?;
            out.done(|| format!("removed directory {path}"), json!({}));
        }
        FsCmd::Rm { path } => {
            let info = dds.lookup(&path)?;
            dds.delete_file(info.id)?;
            out.done(
                || format!("removed {path} ({})", fmt_bytes(info.size)),
                json!({}),
            );
        }
        FsCmd::Mv { from, to } => {
            dds.rename(&from, &to)?;
            out.done(|| format!("renamed {from} to {to}"), json!({}));
        }
        FsCmd::Truncate { path, size } => {
            let info = dds.lookup(&path)?;
            dds.set_file_size(info.id, size)?;
            out.done(
                || format!("{path}: size {} ({size} bytes)", fmt_bytes(size)),
                json!({}),
            );
        }
        FsCmd::Df => {
            let s = dds.free_space()?;
            if json {
                println!("{}", serde_json::to_string(&s).expect("serializable"));
            } else {
                println!(
                    "total {}  free {} ({:.1}%)  segment {}  files {}  dirs {}",
                    fmt_bytes(s.total_bytes),
                    fmt_bytes(s.free_bytes),
                    100.0 * s.free_bytes as f64 / s.total_bytes.max(1) as f64,
                    fmt_bytes(s.segment_size),
                    s.files,
                    s.dirs
                );
            }
        }
        FsCmd::Put { local, remote } => {
            let mut size = None;
            let mut input: Box<dyn Read> = if local == "-" {
                Box::new(std::io::stdin().lock())
            } else {
                let f = std::fs::File::open(&local)
                    .map_err(|e| Failure::Local(format!("{local}: {e}")))?;
                size = f.metadata().ok().map(|m| m.len());
                Box::new(f)
            };
            let bar = copy_bar(size);
            // The data goes to a new file beside the target, which replaces the target only
            // once all of it is written: a failure on either side leaves the target as it was
            // and no partial file behind.
            let temp = temp_sibling(&remote);
            let info = dds.create_file(&temp)?;
            let copied = (|| -> Result<u64, Failure> {
                let mut buf = vec![0u8; CHUNK_BYTES];
                let mut offset = 0u64;
                loop {
                    let n = read_full(&mut input, &mut buf)
                        .map_err(|e| Failure::Local(format!("{local}: {e}")))?;
                    if n == 0 {
                        break;
                    }
                    dds.write_sync(info.id, offset, &buf[..n])?;
                    offset += n as u64;
                    bar.set_position(offset);
                }
                bar.finish_and_clear();
                dds.flush_sync(info.id)?;
                match dds.lookup(&remote) {
                    Ok(old) => dds.delete_file(old.id)?,
                    Err(e) if e.status == Status::NotFound => {}
                    Err(e) => return Err(e.into()),
                }
                dds.rename(&temp, &remote)?;
                Ok(offset)
            })();
            let offset = match copied {
                Ok(n) => n,
                Err(f) => {
                    let _ = dds.delete_file(info.id);
                    return Err(f);
                }
            };
            out.done(
                || {
                    format!(
                        "{local} -> {remote}: {offset} bytes ({}), file id {}",
                        fmt_bytes(offset),
                        info.id
                    )
                },
                json!({"bytes": offset, "id": info.id}),
            );
        }
        FsCmd::Get { remote, local } => {
            let info = dds.lookup(&remote)?;
            let mut sink: Box<dyn Write> = if local == "-" {
                Box::new(std::io::stdout().lock())
            } else {
                Box::new(
                    std::fs::File::create(&local)
                        .map_err(|e| Failure::Local(format!("{local}: {e}")))?,
                )
            };
            let bar = copy_bar((local != "-").then_some(info.size));
            let mut buf = vec![0u8; CHUNK_BYTES];
            let mut offset = 0u64;
            while offset < info.size {
                let want = (info.size - offset).min(CHUNK_BYTES as u64) as usize;
                let n = dds.read_sync(info.id, offset, &mut buf[..want])?;
                if n == 0 {
                    break;
                }
                match sink.write_all(&buf[..n]) {
                    Ok(()) => {}
                    // A reader that has seen enough (`| head`) ends the copy normally.
                    Err(e) if local == "-" && e.kind() == std::io::ErrorKind::BrokenPipe => {
                        return Ok(());
                    }
                    Err(e) => return Err(Failure::Local(format!("{local}: {e}"))),
                }
                offset += n as u64;
                bar.set_position(offset);
            }
            bar.finish_and_clear();
            match sink.flush() {
                Ok(()) => {}
                Err(e) if local == "-" && e.kind() == std::io::ErrorKind::BrokenPipe => {
                    return Ok(());
                }
                Err(e) => return Err(Failure::Local(format!("{local}: {e}"))),
            }
            if local != "-" {
                out.done(
                    || {
                        format!(
                            "{remote} -> {local}: {offset} bytes ({})",
                            fmt_bytes(offset)
                        )
                    },
                    json!({"bytes": offset}),
                );
            }
        }
    }
    Ok(())
}

/// A temporary name in the directory of `remote` (`.put-PID`), short enough for any name limit.
fn temp_sibling(remote: &str) -> String {
    let trimmed = remote.strip_prefix('/').unwrap_or(remote);
    let dir = match trimmed.rsplit_once('/') {
        Some((d, _)) => format!("/{d}/"),
        None => "/".into(),
    };
    format!("{dir}.put-{}", std::process::id())
}

fn read_full(r: &mut dyn Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}
