//! Line charts (PNG) of the benchmark results: single charts with a log-2 x axis
//! ([`LineChart`]) and side-by-side panels with linear axes ([`panels`], the remote-storage
//! figures), one palette and one rule for log axes.

pub mod panels;

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::coord::ranged1d::ValueFormatter;
use plotters::coord::Shift;
use plotters::prelude::*;

/// The text of every chart: DejaVu Sans cut down to the glyphs the charts use (Latin-1, general
/// punctuation, a few arrows and math signs; `fonts/LICENSE`), drawn by plotters' pure-Rust
/// `ab_glyph` backend, so that no system font is looked up.
const FONT: &[u8] = include_bytes!("../fonts/DejaVuSans-subset.ttf");

/// Makes [`FONT`] plotters' `sans-serif` (once per process).
fn register_font() -> Result<()> {
    static REGISTERED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        plotters::style::register_font("sans-serif", FontStyle::Normal, FONT).is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err(anyhow!("the embedded chart font does not load"))
    }
}

/// One line of a chart.
#[derive(Clone, Debug, Default)]
pub struct Series {
    pub name: String,
    /// (x, y) points: drawn in x order whatever their order here.
    pub points: Vec<(f64, f64)>,
    /// The spread of the trials behind the points: (x, min, max), drawn as a vertical bar.
    pub spread: Vec<(f64, f64, f64)>,
}

impl Series {
    /// The points in x order (finite, positive x).
    fn sorted(&self, log_y: bool) -> Vec<(f64, f64)> {
        let mut pts: Vec<(f64, f64)> = self
            .points
            .iter()
            .copied()
            .filter(|(x, y)| *x > 0.0 && y.is_finite() && (!log_y || *y > 0.0))
            .collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        pts
    }
}

/// Whether positive values span at least two decades (then a log axis reads better).
pub fn spans_decades(values: impl IntoIterator<Item = f64>) -> bool {
    let (mut lo, mut hi) = (f64::MAX, 0f64);
    for v in values.into_iter().filter(|v| v.is_finite() && *v > 0.0) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    hi > 0.0 && hi / lo >= 100.0
}

/// A chart with a log-2 x axis and a linear or logarithmic y axis.
#[derive(Clone, Debug)]
pub struct LineChart {
    /// File name under the results directory (`.png`).
    pub file: String,
    pub title: String,
    /// Small print under the chart (machine, DPU emulation).
    pub note: String,
    pub x_label: String,
    pub y_label: String,
    /// Logarithmic y axis; set it where values span decades (see [`spans_decades`]).
    pub log_y: bool,
    pub series: Vec<Series>,
}

/// The palette of every chart.
pub(crate) const COLORS: [RGBColor; 6] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
];

impl LineChart {
    fn bounds(&self) -> Option<((f64, f64), (f64, f64))> {
        let pts = self
            .series
            .iter()
            .flat_map(|s| s.points.iter())
            .filter(|(x, y)| {
                x.is_finite() && y.is_finite() && *x > 0.0 && (!self.log_y || *y > 0.0)
            });
        let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
        let mut any = false;
        for &(x, y) in pts {
            any = true;
            x0 = x0.min(x);
            x1 = x1.max(x);
            y0 = y0.min(y);
            y1 = y1.max(y);
        }
        if !any {
            return None;
        }
        let (x0, x1) = if x1 > x0 {
            (x0, x1)
        } else {
            (x0 / 2.0, x1 * 2.0)
        };
        let (y0, y1) = if self.log_y {
            (y0 / 2.0, y1 * 2.0)
        } else {
            (0.0, if y1 > 0.0 { y1 * 1.15 } else { 1.0 })
        };
        Some(((x0 / 1.15, x1 * 1.15), (y0, y1)))
    }

    /// The corner (or right middle) of the plot area that covers the fewest data points.
    fn legend_position(&self) -> SeriesLabelPosition {
        let Some(((x0, x1), (y0, y1))) = self.bounds() else {
            return SeriesLabelPosition::UpperRight;
        };
        let nx = |x: f64| (x / x0).ln() / (x1 / x0).ln();
        let ny = |y: f64| {
            if self.log_y {
                (y / y0).ln() / (y1 / y0).ln()
            } else {
                (y - y0) / (y1 - y0)
            }
        };
        let pts: Vec<(f64, f64)> = self
            .series
            .iter()
            .flat_map(|s| s.points.iter())
            .filter(|(x, y)| *x > 0.0 && y.is_finite() && (!self.log_y || *y > 0.0))
            .map(|&(x, y)| (nx(x), ny(y)))
            .collect();
        let boxes = [
            (SeriesLabelPosition::UpperRight, (0.6, 1.0), (0.7, 1.0)),
            (SeriesLabelPosition::UpperLeft, (0.0, 0.4), (0.7, 1.0)),
            (SeriesLabelPosition::MiddleRight, (0.6, 1.0), (0.35, 0.65)),
            (SeriesLabelPosition::LowerRight, (0.6, 1.0), (0.0, 0.3)),
            (SeriesLabelPosition::LowerLeft, (0.0, 0.4), (0.0, 0.3)),
        ];
        boxes
            .into_iter()
            .min_by_key(|(_, (xa, xb), (ya, yb))| {
                pts.iter()
                    .filter(|(x, y)| (*xa..=*xb).contains(x) && (*ya..=*yb).contains(y))
                    .count()
            })
            .map_or(SeriesLabelPosition::UpperRight, |b| b.0)
    }

    /// Draws the chart as a PNG at `path`.
    pub fn draw(&self, path: &Path) -> Result<()> {
        register_font()?;
        let root = BitMapBackend::new(path, (640, 420)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
        let (upper, lower) = root.split_vertically(396);
        lower
            .draw_text(
                &self.note,
                &("sans-serif", 11).into_font().color(&RGBColor(80, 80, 80)),
                (8, 5),
            )
            .map_err(|e| anyhow!("{e}"))?;
        let Some(((x0, x1), (y0, y1))) = self.bounds() else {
            root.present().map_err(|e| anyhow!("{e}"))?;
            return Ok(());
        };
        let mut builder = ChartBuilder::on(&upper);
        builder
            .caption(&self.title, ("sans-serif", 17))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(72);
        if self.log_y {
            let chart = builder
                .build_cartesian_2d((x0..x1).log_scale().base(2.0), (y0..y1).log_scale())
                .map_err(|e| anyhow!("{e}"))?;
            self.fill(chart, &upper)?;
        } else {
            let chart = builder
                .build_cartesian_2d((x0..x1).log_scale().base(2.0), y0..y1)
                .map_err(|e| anyhow!("{e}"))?;
            self.fill(chart, &upper)?;
        }
        root.present().map_err(|e| anyhow!("{e}"))?;
        Ok(())
    }

    fn fill<'a, X, Y>(
        &self,
        mut chart: ChartContext<'a, BitMapBackend<'a>, Cartesian2d<X, Y>>,
        _area: &DrawingArea<BitMapBackend<'a>, Shift>,
    ) -> Result<()>
    where
        X: Ranged<ValueType = f64> + ValueFormatter<f64>,
        Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
    {
        chart
            .configure_mesh()
            .x_desc(&self.x_label)
            .y_desc(&self.y_label)
            .x_label_formatter(&|x| fmt_tick(*x))
            .y_label_formatter(&|y| fmt_axis(*y))
            .light_line_style(TRANSPARENT)
            .bold_line_style(RGBColor(225, 225, 225))
            .draw()
            .map_err(|e| anyhow!("{e}"))?;
        for (i, s) in self.series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let pts = s.sorted(self.log_y);
            // The spread of the trials: a bar from the smallest to the largest.
            let bars = s
                .spread
                .iter()
                .filter(|(x, lo, hi)| {
                    *x > 0.0 && lo.is_finite() && hi.is_finite() && (!self.log_y || *lo > 0.0)
                })
                .map(|&(x, lo, hi)| {
                    PathElement::new(vec![(x, lo), (x, hi)], color.stroke_width(1))
                });
            chart.draw_series(bars).map_err(|e| anyhow!("{e}"))?;
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                .map_err(|e| anyhow!("{e}"))?
                .label(&s.name)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                });
            chart
                .draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))
                .map_err(|e| anyhow!("{e}"))?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(180, 180, 180))
            .position(self.legend_position())
            .draw()
            .map_err(|e| anyhow!("{e}"))?;
        Ok(())
    }
}

/// An x tick: the axes count things (threads, KiB, readers), so only whole values get a label.
fn fmt_tick(v: f64) -> String {
    if (v - v.round()).abs() > 1e-6 * v.abs().max(1.0) {
        String::new()
    } else if v.abs() < 1e5 {
        format!("{}", v.round() as i64)
    } else {
        fmt_axis(v.round())
    }
}

pub(crate) fn fmt_axis(v: f64) -> String {
    let a = v.abs();
    if a >= 1e9 {
        format!("{}G", trim(v / 1e9))
    } else if a >= 1e6 {
        format!("{}M", trim(v / 1e6))
    } else if a >= 1e3 {
        format!("{}k", trim(v / 1e3))
    } else {
        trim(v)
    }
}

fn trim(v: f64) -> String {
    let s = format!("{v:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_drawn_with_the_embedded_font() {
        let dir = tempfile::tempdir().unwrap();
        let chart = |note: &str| LineChart {
            file: String::new(),
            title: "GETs × connections".into(),
            note: note.into(),
            x_label: "client connections".into(),
            y_label: "p99 µs".into(),
            log_y: false,
            series: vec![Series {
                name: "no-offload".into(),
                points: vec![(1.0, 10.0), (4.0, 30.0), (16.0, 20.0)],
                spread: Vec::new(),
            }],
        };
        let (a, b) = (dir.path().join("a.png"), dir.path().join("b.png"));
        chart("").draw(&a).unwrap();
        chart("2 CPUs; DPU emulated — 12 µs").draw(&b).unwrap();
        let (a, b) = (std::fs::read(a).unwrap(), std::fs::read(b).unwrap());
        assert!(a.starts_with(b"\x89PNG") && b.starts_with(b"\x89PNG"));
        assert_ne!(a, b, "the note left no pixels");
    }

    #[test]
    fn axis_labels() {
        assert_eq!(fmt_axis(2_000_000.0), "2M");
        assert_eq!(fmt_axis(1536.0), "1.54k");
        assert_eq!(fmt_axis(0.5), "0.5");
        assert_eq!(fmt_tick(8.0), "8");
        assert_eq!(fmt_tick(1.41), "");
        assert_eq!(fmt_tick(4096.0), "4096");
        assert_eq!(fmt_tick(2_097_152.0), "2.1M");
    }

    #[test]
    fn points_in_x_order_and_decades() {
        let s = Series {
            name: "a".into(),
            points: vec![(4.0, 1.0), (1.0, 3.0), (2.0, 2.0)],
            spread: Vec::new(),
        };
        assert_eq!(s.sorted(false), [(1.0, 3.0), (2.0, 2.0), (4.0, 1.0)]);
        assert!(spans_decades([1.0, 50.0, 100.0]));
        assert!(!spans_decades([10.0, 50.0, 0.0]));
    }
}
