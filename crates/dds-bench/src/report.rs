//! What a benchmark hands back: raw points, a summary with the targets' figures, tables to
//! print, plots to draw; and writing them under the results directory.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Serialize;
use serde_json::Value;

use crate::machine::Machine;
use crate::plot::{panels, LineChart};

/// A goal a figure of the summary is held to.
#[derive(Clone, Debug, Serialize)]
pub struct Target {
    /// What is compared, e.g. `progress msgs/s at 64 producers`.
    pub name: String,
    /// `>=` or `<=`.
    pub op: &'static str,
    pub goal: f64,
    pub measured: f64,
    pub met: bool,
}

impl Target {
    pub fn at_least(name: impl Into<String>, measured: f64, goal: f64) -> Target {
        Target {
            name: name.into(),
            op: ">=",
            goal,
            measured,
            met: measured.is_finite() && measured >= goal,
        }
    }

    pub fn at_most(name: impl Into<String>, measured: f64, goal: f64) -> Target {
        Target {
            name: name.into(),
            op: "<=",
            goal,
            measured,
            met: measured.is_finite() && measured <= goal,
        }
    }
}

/// A table for the terminal (rendered as Markdown).
#[derive(Clone, Debug, Default)]
pub struct Table {
    pub title: String,
    pub headers: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(title: impl Into<String>, headers: &[&str]) -> Table {
        Table {
            title: title.into(),
            headers: headers.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let n = self.headers.len();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for r in &self.rows {
            for (i, c) in r.iter().enumerate().take(n) {
                widths[i] = widths[i].max(c.chars().count());
            }
        }
        let line = |cells: &[String]| {
            let mut s = String::from("|");
            for (i, w) in widths.iter().enumerate() {
                let c = cells.get(i).map(String::as_str).unwrap_or("");
                let pad = w - c.chars().count();
                if i == 0 {
                    let _ = write!(s, " {c}{} |", " ".repeat(pad));
                } else {
                    let _ = write!(s, " {}{c} |", " ".repeat(pad));
                }
            }
            s
        };
        let mut out = String::new();
        if !self.title.is_empty() {
            let _ = writeln!(out, "{}\n", self.title);
        }
        let _ = writeln!(out, "{}", line(&self.headers));
        let mut sep = String::from("|");
        for (i, w) in widths.iter().enumerate() {
            if i == 0 {
                let _ = write!(sep, "{}|", "-".repeat(w + 2));
            } else {
                let _ = write!(sep, "{}:|", "-".repeat(w + 1));
            }
        }
        let _ = writeln!(out, "{sep}");
        for r in &self.rows {
            let _ = writeln!(out, "{}", line(r));
        }
        out
    }
}

/// Everything one benchmark run produced.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub benchmark: String,
    /// The command line that produced it.
    pub command: String,
    /// How the DPU was emulated in this run.
    pub dpu_emulation: String,
    pub machine: Machine,
    pub config: Value,
    pub summary: Value,
    pub points: Value,
    #[serde(skip)]
    pub tables: Vec<Table>,
    #[serde(skip)]
    pub charts: Vec<LineChart>,
    /// Figures of several panels side by side (the remote-storage figures).
    #[serde(skip)]
    pub panels: Vec<panels::Figure>,
}

impl Report {
    /// The summary's `targets` array, if any.
    pub fn targets(&self) -> Vec<Target> {
        self.summary
            .get("targets")
            .and_then(|t| t.as_array())
            .map(|a| {
                a.iter()
                    .filter_map(|t| {
                        Some(Target {
                            name: t.get("name")?.as_str()?.to_string(),
                            op: if t.get("op")?.as_str()? == "<=" {
                                "<="
                            } else {
                                ">="
                            },
                            goal: t.get("goal")?.as_f64()?,
                            measured: t.get("measured")?.as_f64()?,
                            met: t.get("met")?.as_bool()?,
                        })
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The text printed at the end of a run: notes, tables and targets.
    pub fn render(&self) -> String {
        let mut out = self.render_results();
        let targets = self.targets();
        if !targets.is_empty() {
            let mut t = Table::new("Targets", &["target", "goal", "measured", "met"]);
            for g in targets {
                t.row(vec![
                    g.name.clone(),
                    format!("{} {}", g.op, fmt_num(g.goal)),
                    fmt_num(g.measured),
                    if g.met { "yes" } else { "no" }.into(),
                ]);
            }
            let _ = writeln!(out, "{}", t.render());
        }
        out
    }

    /// The report without its targets: the machine, the DPU's emulation and the tables.
    pub fn render_results(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "dds bench {}", self.benchmark);
        let _ = writeln!(out, "{}", self.machine.line());
        let _ = writeln!(out, "DPU: {}\n", self.dpu_emulation);
        for t in &self.tables {
            let _ = writeln!(out, "{}", t.render());
        }
        out
    }

    /// The JSON document: pretty-printed, with one line per raw point.
    pub fn to_json(&self) -> Result<String> {
        let mut v = serde_json::to_value(self)?;
        let points = v["points"].take();
        let text = serde_json::to_string_pretty(&v)?;
        let lines = points
            .as_array()
            .map(|a| {
                a.iter()
                    .map(serde_json::to_string)
                    .collect::<Result<Vec<_>, _>>()
            })
            .transpose()?
            .unwrap_or_default();
        let array = if lines.is_empty() {
            "[]".to_string()
        } else {
            format!("[\n    {}\n  ]", lines.join(",\n    "))
        };
        Ok(text.replacen("\"points\": null", &format!("\"points\": {array}"), 1) + "\n")
    }

    /// Whether the DPU shared the host's cores in this run (`--shared-cores`): its files
    /// then sit beside the dedicated-core run's instead of replacing them.
    pub fn shared_cores(&self) -> bool {
        self.config
            .get("placement")
            .is_some_and(|p| p.get("dpu_cpus").is_some_and(Value::is_null))
    }

    /// Writes `<dir>/<benchmark>.json` and the plots (charts and panel figures) (`<benchmark>-shared-cores.json` and
    /// `shared-cores-<plot>` for a shared-cores run); returns the paths written.
    pub fn write(&self, dir: &Path) -> Result<Vec<PathBuf>> {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        let mut written = Vec::new();
        let (suffix, prefix) = if self.shared_cores() {
            ("-shared-cores", "shared-cores-")
        } else {
            ("", "")
        };
        let json = dir.join(format!("{}{suffix}.json", self.benchmark));
        let text = self.to_json()?;
        std::fs::write(&json, text).with_context(|| format!("write {}", json.display()))?;
        written.push(json);
        for c in &self.charts {
            let path = dir.join(format!("{prefix}{}", c.file));
            c.draw(&path)
                .with_context(|| format!("draw {}", path.display()))?;
            written.push(path);
        }
        for f in &self.panels {
            let path = dir.join(format!("{prefix}{}", f.file));
            panels::draw(&path, &f.charts).with_context(|| format!("draw {}", path.display()))?;
            written.push(path);
        }
        Ok(written)
    }
}

/// A number for a table: three significant digits, with an SI suffix when large.
pub fn fmt_num(x: f64) -> String {
    let a = x.abs();
    if a >= 1e9 {
        format!("{:.3}G", x / 1e9)
    } else if a >= 1e6 {
        format!("{:.3}M", x / 1e6)
    } else if a >= 1e4 {
        format!("{:.1}k", x / 1e3)
    } else if a >= 100.0 {
        format!("{x:.0}")
    } else if a >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    }
}

/// Median of a non-empty list (mean of the two middle values for even lengths).
pub fn median(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The smallest finite value (0 when there is none).
pub fn min_of(values: &[f64]) -> f64 {
    values
        .iter()
        .copied()
        .filter(|x| x.is_finite())
        .reduce(f64::min)
        .unwrap_or(0.0)
}

/// The largest finite value (0 when there is none).
pub fn max_of(values: &[f64]) -> f64 {
    values
        .iter()
        .copied()
        .filter(|x| x.is_finite())
        .reduce(f64::max)
        .unwrap_or(0.0)
}

/// `a / b`: 0 when `b` is 0, NaN when either side is NaN (not measured).
pub fn ratio(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        // A side that was not measured: so is the ratio (a target on it is not met).
        f64::NAN
    } else if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_renders_markdown() {
        let mut t = Table::new("", &["a", "bb"]);
        t.row(vec!["x".into(), "12345".into()]);
        let s = t.render();
        assert!(s.contains("| a |    bb |"), "{s}");
        assert!(s.contains("| x | 12345 |"), "{s}");
    }

    #[test]
    fn numbers_and_medians() {
        assert_eq!(fmt_num(20_500_000.0), "20.500M");
        assert_eq!(fmt_num(0.25), "0.250");
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(ratio(1.0, 0.0), 0.0);
        assert!(ratio(f64::NAN, 2.0).is_nan() && ratio(1.0, f64::NAN).is_nan());
        assert!(!Target::at_most("x", f64::NAN, 1.0).met);
        assert!(!Target::at_least("x", f64::NAN, 1.0).met);
    }

    #[test]
    fn a_shared_cores_run_is_written_beside_the_dedicated_one() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = Report {
            benchmark: "x".into(),
            command: String::new(),
            dpu_emulation: String::new(),
            machine: crate::machine::Machine::detect(),
            config: serde_json::json!({"placement": {"dpu_cpus": "1", "host_cpus": [0]}}),
            summary: Value::Null,
            points: Value::Array(Vec::new()),
            tables: Vec::new(),
            charts: Vec::new(),
            panels: Vec::new(),
        };
        assert!(!r.shared_cores());
        r.write(dir.path()).unwrap();
        r.config = serde_json::json!({"placement": {"dpu_cpus": null, "host_cpus": null}});
        assert!(r.shared_cores());
        r.write(dir.path()).unwrap();
        assert!(dir.path().join("x.json").exists());
        assert!(dir.path().join("x-shared-cores.json").exists());
    }
}
