//! PNG charts of the remote-storage benchmarks (several panels side by side, line charts
//! with points).

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::coord::ranged1d::ValueFormatter;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use super::{fmt_axis, spans_decades, COLORS};

/// One line of a chart.
#[derive(Clone, Debug)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    /// Drawn thinner with hollow points in the previous series' color (e.g. p99 after p50).
    pub secondary: bool,
}

/// A chart: linear axes starting at zero.
#[derive(Clone, Debug)]
pub struct Chart {
    pub title: String,
    /// Small print under the title (machine, DPU emulation).
    pub note: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
}

impl Chart {
    fn bounds(&self) -> (f64, f64) {
        let mut x1 = 0f64;
        let mut y1 = 0f64;
        for (x, y) in self.series.iter().flat_map(|s| s.points.iter()) {
            if x.is_finite() && y.is_finite() {
                x1 = x1.max(*x);
                y1 = y1.max(*y);
            }
        }
        (
            if x1 > 0.0 { x1 * 1.1 } else { 1.0 },
            if y1 > 0.0 { y1 * 1.15 } else { 1.0 },
        )
    }
}

/// Charts drawn side by side into one PNG (`file`, under the results directory).
#[derive(Clone, Debug)]
pub struct Figure {
    pub file: String,
    pub charts: Vec<Chart>,
}

/// Draws the charts side by side into one PNG. Lines follow x order; a y axis whose values
/// span two decades or more is logarithmic.
pub fn draw(path: &Path, charts: &[Chart]) -> Result<()> {
    super::register_font()?;
    let w = 640 * charts.len().max(1) as u32;
    let root = BitMapBackend::new(path, (w, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    let panels = root.split_evenly((1, charts.len().max(1)));
    for (chart, area) in charts.iter().zip(panels.iter()) {
        let (x1, y1) = chart.bounds();
        let (top, body) = area.split_vertically(48);
        top.draw(&Text::new(
            chart.title.clone(),
            (10, 4),
            ("sans-serif", 18).into_font(),
        ))
        .map_err(|e| anyhow!("{e}"))?;
        top.draw(&Text::new(
            chart.note.clone(),
            (10, 26),
            ("sans-serif", 12).into_font().color(&RGBColor(90, 90, 90)),
        ))
        .map_err(|e| anyhow!("{e}"))?;
        let ys = || {
            chart
                .series
                .iter()
                .flat_map(|s| s.points.iter().map(|p| p.1))
        };
        let mut builder = ChartBuilder::on(&body);
        builder
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(64);
        if spans_decades(ys()) {
            let y0 = ys()
                .filter(|y| y.is_finite() && *y > 0.0)
                .fold(f64::MAX, f64::min);
            let c = builder
                .build_cartesian_2d(0f64..x1, (y0 / 1.5..y1 * 1.5).log_scale())
                .map_err(|e| anyhow!("{e}"))?;
            fill(chart, c, true)?;
        } else {
            let c = builder
                .build_cartesian_2d(0f64..x1, 0f64..y1)
                .map_err(|e| anyhow!("{e}"))?;
            fill(chart, c, false)?;
        }
    }
    root.present().map_err(|e| anyhow!("{e}"))?;
    Ok(())
}

fn fill<'a, Y>(
    chart: &Chart,
    mut c: ChartContext<'a, BitMapBackend<'a>, Cartesian2d<RangedCoordf64, Y>>,
    log_y: bool,
) -> Result<()>
where
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    c.configure_mesh()
        .x_desc(chart.x_label.as_str())
        .y_desc(chart.y_label.as_str())
        .x_label_formatter(&|x| fmt_axis(*x))
        .y_label_formatter(&|y| fmt_axis(*y))
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    // A secondary series (e.g. p99) takes the color of the primary one before it.
    let mut color_index = 0usize;
    for (i, s) in chart.series.iter().enumerate() {
        if i > 0 && !s.secondary {
            color_index += 1;
        }
        let color = COLORS[color_index % COLORS.len()];
        let mut pts: Vec<(f64, f64)> = s
            .points
            .iter()
            .copied()
            .filter(|(x, y)| x.is_finite() && y.is_finite() && (!log_y || *y > 0.0))
            .collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        let width = if s.secondary { 1 } else { 2 };
        c.draw_series(LineSeries::new(pts.clone(), color.stroke_width(width)))
            .map_err(|e| anyhow!("{e}"))?
            .label(s.name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(width))
            });
        let secondary = s.secondary;
        c.draw_series(pts.iter().map(|&p| {
            if secondary {
                Circle::new(p, 4, color.stroke_width(1))
            } else {
                Circle::new(p, 4, color.filled())
            }
        }))
        .map_err(|e| anyhow!("{e}"))?;
    }
    c.configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    Ok(())
}
