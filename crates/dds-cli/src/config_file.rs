//! `dds dpu --config FILE`, `dds nbd --config FILE` and `dds s3 --config FILE`: the daemon's
//! options from a TOML file, every one overridable on the command line. Keys are the long
//! option names (`director-memory = "64M"`, `allow-uid = [1000, 1001]`, `spin = true`); the
//! file's values go in front of the command line's, so a value given on the command line wins.

use anyhow::{bail, Context, Result};

/// `args` with the options of the `--config FILE` (or `--config=FILE`) of a `dds dpu`,
/// `dds nbd` or `dds s3` command line expanded in place of it. Other command lines are returned
/// unchanged.
pub fn expand(args: Vec<String>) -> Result<Vec<String>> {
    let Some(dpu) = args
        .iter()
        .position(|a| a == "dpu" || a == "nbd" || a == "s3")
    else {
        return Ok(args);
    };
    let mut file = None;
    let mut rest = Vec::with_capacity(args.len());
    let mut it = args.into_iter().enumerate();
    while let Some((i, a)) = it.next() {
        if i > dpu && a == "--config" {
            let (_, f) = it.next().context("--config needs a file")?;
            file = Some(f);
        } else if let Some(f) = a.strip_prefix("--config=").filter(|_| i > dpu) {
            file = Some(f.to_string());
        } else {
            rest.push(a);
        }
    }
    let Some(file) = file else {
        return Ok(rest);
    };
    let text = std::fs::read_to_string(&file).with_context(|| format!("read {file}"))?;
    let from_file = options(&text).with_context(|| file.clone())?;
    let mut out = rest[..=dpu].to_vec();
    out.extend(from_file);
    out.extend_from_slice(&rest[dpu + 1..]);
    Ok(out)
}

/// The command-line options a TOML document stands for.
fn options(text: &str) -> Result<Vec<String>> {
    let table: toml::Table = text.parse().context("not valid TOML")?;
    let mut out = Vec::new();
    for (key, value) in table {
        let flag = format!("--{}", key.replace('_', "-"));
        let scalar = |v: &toml::Value| -> Result<String> {
            Ok(match v {
                toml::Value::String(s) => s.clone(),
                toml::Value::Integer(i) => i.to_string(),
                toml::Value::Float(f) => f.to_string(),
                _ => bail!("`{key}`: a string or a number is expected"),
            })
        };
        match &value {
            toml::Value::Boolean(true) => out.push(flag),
            toml::Value::Boolean(false) => {}
            toml::Value::Array(items) => {
                for v in items {
                    out.push(flag.clone());
                    out.push(scalar(v)?);
                }
            }
            v => {
                out.push(flag);
                out.push(scalar(v)?);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn file_values_come_first_so_the_command_line_wins() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("dpu.toml");
        std::fs::write(
            &f,
            "device = \"a.img\"\ndirector_memory = \"64M\"\nspin = true\nallow-uid = [7, 8]\n",
        )
        .unwrap();
        let line = format!("dds dpu --config {} --device b.img", f.display());
        let got = expand(args(&line)).unwrap();
        assert_eq!(
            got,
            args(
                "dds dpu --allow-uid 7 --allow-uid 8 --device a.img --director-memory 64M \
                 --spin --device b.img"
            )
        );
        assert_eq!(expand(args("dds fs ls")).unwrap(), args("dds fs ls"));
        std::fs::write(&f, "device = [").unwrap();
        assert!(expand(args(&line)).is_err());
    }
}
