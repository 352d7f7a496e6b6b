//! A simple reference model of directories, files and contents, and the text form of ops
//! shared with the crash worker binary.
#![allow(dead_code)]

use super::pattern;
use dds_fs::{EntryKind, FileService, FsError};
use std::collections::{BTreeMap, BTreeSet};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    CreateDir(String),
    RemoveDir(String),
    CreateFile(String),
    Delete(String),
    Rename(String, String),
    Resize(String, u64),
    /// path, offset, length, pattern seed; followed by a flush
    Write(String, u64, u32, u64),
}

impl Op {
    pub fn parse(s: &str) -> Option<Op> {
        let w: Vec<&str> = s.split_whitespace().collect();
        Some(match w.as_slice() {
            ["create_dir", n] => Op::CreateDir(n.to_string()),
            ["remove_dir", n] => Op::RemoveDir(n.to_string()),
            ["create_file", p] => Op::CreateFile(p.to_string()),
            ["delete", p] => Op::Delete(p.to_string()),
            ["rename", a, b] => Op::Rename(a.to_string(), b.to_string()),
            ["resize", p, n] => Op::Resize(p.to_string(), n.parse().ok()?),
            ["write", p, o, l, s] => Op::Write(
                p.to_string(),
                o.parse().ok()?,
                l.parse().ok()?,
                s.parse().ok()?,
            ),
            _ => return None,
        })
    }

    pub fn path(&self) -> &str {
        match self {
            Op::CreateDir(p) | Op::RemoveDir(p) | Op::CreateFile(p) | Op::Delete(p) => p,
            Op::Rename(p, _) | Op::Resize(p, _) | Op::Write(p, ..) => p,
        }
    }
}

/// Canonical path: "/name" or "/dir/name".
pub fn canon(p: &str) -> String {
    if p.starts_with('/') {
        p.to_string()
    } else {
        format!("/{p}")
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Model {
    pub dirs: BTreeSet<String>,
    pub files: BTreeMap<String, Vec<u8>>,
}

impl Model {
    /// Applies an op known to be valid.
    pub fn apply(&mut self, op: &Op) {
        match op {
            Op::CreateDir(n) => {
                assert!(self.dirs.insert(n.trim_start_matches('/').to_string()));
            }
            Op::RemoveDir(n) => {
                assert!(self.dirs.remove(n.trim_start_matches('/')));
            }
            Op::CreateFile(p) => {
                assert!(self.files.insert(canon(p), Vec::new()).is_none());
            }
            Op::Delete(p) => {
                assert!(self.files.remove(&canon(p)).is_some());
            }
            Op::Rename(a, b) => {
                let d = self.files.remove(&canon(a)).expect("rename source");
                assert!(self.files.insert(canon(b), d).is_none());
            }
            Op::Resize(p, n) => {
                self.files
                    .get_mut(&canon(p))
                    .expect("file")
                    .resize(*n as usize, 0);
            }
            Op::Write(p, off, len, seed) => {
                let f = self.files.get_mut(&canon(p)).expect("file");
                let end = (*off + u64::from(*len)) as usize;
                if f.len() < end {
                    f.resize(end, 0);
                }
                f[*off as usize..end].copy_from_slice(&pattern(*seed, *len as usize));
            }
        }
    }
}

/// Applies `op` to the file service synchronously (writes are followed by a flush).
pub fn apply_fs(fs: &mut FileService, op: &Op) -> Result<(), FsError> {
    match op {
        Op::CreateDir(n) => fs.create_dir(n),
        Op::RemoveDir(n) => fs.remove_dir(n),
        Op::CreateFile(p) => fs.create_file(p).map(|_| ()),
        Op::Delete(p) => fs.delete_file(p),
        Op::Rename(a, b) => fs.rename_file(a, b),
        Op::Resize(p, n) => {
            let id = fs.lookup(p)?.id;
            fs.resize(id, *n)
        }
        Op::Write(p, off, len, seed) => {
            let id = fs.lookup(p)?.id;
            let data = pattern(*seed, *len as usize);
            super::write(fs, id, *off, &data)?;
            fs.submit_flush(99)?;
            super::wait_for(fs, 99).map(|_| ())
        }
    }
}

/// Reads the whole visible state of the file service.
pub fn snapshot(fs: &mut FileService) -> Model {
    let mut m = Model::default();
    let mut paths = Vec::new();
    for e in fs.list_dir("/").unwrap() {
        match e.kind {
            EntryKind::Dir => {
                m.dirs.insert(e.name.clone());
                for f in fs.list_dir(&e.name).unwrap() {
                    paths.push(format!("/{}/{}", e.name, f.name));
                }
            }
            EntryKind::File => paths.push(format!("/{}", e.name)),
        }
    }
    for p in paths {
        let info = fs.lookup(&p).unwrap();
        let mut data = Vec::with_capacity(info.size as usize);
        let chunk = fs.max_io_bytes().min(1 << 20) as u64;
        let mut off = 0;
        while off < info.size {
            let n = chunk.min(info.size - off) as u32;
            data.extend(super::read_aligned(fs, info.id, off, n).unwrap());
            off += u64::from(n);
        }
        assert_eq!(data.len() as u64, info.size);
        m.files.insert(p, data);
    }
    m
}

/// Checks that `got` equals `acked`, or `acked` with `pending` applied (a write may be
/// partially applied: each byte old or new, size old or new).
pub fn check_recovered(got: &Model, acked: &Model, pending: Option<&Op>) -> Result<(), String> {
    if got == acked {
        return Ok(());
    }
    let Some(op) = pending else {
        return Err(diff(got, acked));
    };
    let mut after = acked.clone();
    after.apply(op);
    if *got == after {
        return Ok(());
    }
    if let Op::Write(p, off, len, _) = op {
        let p = canon(p);
        let (Some(g), Some(old), Some(new)) =
            (got.files.get(&p), acked.files.get(&p), after.files.get(&p))
        else {
            return Err(format!("pending write: file {p} missing"));
        };
        let mut others_got = got.clone();
        others_got.files.remove(&p);
        let mut others = acked.clone();
        others.files.remove(&p);
        if others_got != others {
            return Err(diff(&others_got, &others));
        }
        if g.len() != old.len() && g.len() != new.len() {
            return Err(format!(
                "pending write: size {} not {} or {}",
                g.len(),
                old.len(),
                new.len()
            ));
        }
        for (i, &b) in g.iter().enumerate() {
            let o = old.get(i).copied().unwrap_or(0);
            let in_range = (i as u64) >= *off && (i as u64) < off + u64::from(*len);
            if b != o && !(in_range && b == new[i]) {
                return Err(format!("pending write: byte {i} of {p} is {b}, old {o}"));
            }
        }
        return Ok(());
    }
    Err(format!(
        "neither before nor after {op:?}: {}",
        diff(got, &after)
    ))
}

fn diff(a: &Model, b: &Model) -> String {
    if a.dirs != b.dirs {
        return format!("dirs {:?} vs {:?}", a.dirs, b.dirs);
    }
    let ka: Vec<_> = a.files.keys().collect();
    let kb: Vec<_> = b.files.keys().collect();
    if ka != kb {
        return format!("files {ka:?} vs {kb:?}");
    }
    for (k, v) in &a.files {
        let w = &b.files[k];
        if v.len() != w.len() {
            return format!("{k}: size {} vs {}", v.len(), w.len());
        }
        if let Some(i) = v.iter().zip(w).position(|(x, y)| x != y) {
            return format!("{k}: byte {i} differs ({} vs {})", v[i], w[i]);
        }
    }
    "equal".into()
}

/// Generates a random valid op for the model (small files, few names).
pub fn gen_op(m: &Model, r: &mut impl FnMut(u64) -> u64, max_size: u64) -> Op {
    let dirs: Vec<&String> = m.dirs.iter().collect();
    let files: Vec<&String> = m.files.keys().collect();
    loop {
        match r(10) {
            0 if m.dirs.len() < 3 => {
                let n = format!("d{}", r(5));
                if !m.dirs.contains(&n) && !m.files.contains_key(&format!("/{n}")) {
                    return Op::CreateDir(n);
                }
            }
            1 if !dirs.is_empty() => {
                let d = dirs[r(dirs.len() as u64) as usize];
                if !m.files.keys().any(|f| f.starts_with(&format!("/{d}/"))) {
                    return Op::RemoveDir(d.clone());
                }
            }
            2 | 3 if m.files.len() < 12 => {
                let p = random_path(m, r);
                if let Some(p) = p {
                    return Op::CreateFile(p);
                }
            }
            4 if !files.is_empty() => {
                return Op::Delete(files[r(files.len() as u64) as usize].clone())
            }
            5 if !files.is_empty() => {
                let a = files[r(files.len() as u64) as usize].clone();
                if let Some(b) = random_path(m, r) {
                    return Op::Rename(a, b);
                }
            }
            6 | 7 if !files.is_empty() => {
                let a = files[r(files.len() as u64) as usize].clone();
                return Op::Resize(a, r(max_size));
            }
            8 | 9 if !files.is_empty() => {
                let a = files[r(files.len() as u64) as usize].clone();
                let off = r(max_size);
                let len = 1 + r((max_size - off).min(40_000)) as u32;
                return Op::Write(a, off, len, r(1 << 30));
            }
            _ => {}
        }
    }
}

fn random_path(m: &Model, r: &mut impl FnMut(u64) -> u64) -> Option<String> {
    let dirs: Vec<&String> = m.dirs.iter().collect();
    let name = format!("f{}", r(20));
    let p = if dirs.is_empty() || r(3) == 0 {
        format!("/{name}")
    } else {
        format!("/{}/{name}", dirs[r(dirs.len() as u64) as usize])
    };
    let root_clash = p.matches('/').count() == 1 && m.dirs.contains(&name);
    (!m.files.contains_key(&p) && !root_clash).then_some(p)
}

/// xorshift64 closure.
pub fn rng(seed: u64) -> impl FnMut(u64) -> u64 {
    let mut x = seed.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1;
    move |m: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if m == 0 {
            0
        } else {
            x % m
        }
    }
}
