//! PNG charts of the remote-storage benchmarks (line charts with points).

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::prelude::*;

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

const COLORS: [RGBColor; 6] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
];

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

/// Draws the charts side by side into one PNG.
pub fn draw(path: &Path, charts: &[Chart]) -> Result<()> {
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
        let mut c = ChartBuilder::on(&body)
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(64)
            .build_cartesian_2d(0f64..x1, 0f64..y1)
            .map_err(|e| anyhow!("{e}"))?;
        c.configure_mesh()
            .x_desc(chart.x_label.as_str())
            .y_desc(chart.y_label.as_str())
            .draw()
            .map_err(|e| anyhow!("{e}"))?;
        // A secondary series (e.g. p99) takes the color of the primary one before it.
        let mut color_index = 0usize;
        for (i, s) in chart.series.iter().enumerate() {
            if i > 0 && !s.secondary {
                color_index += 1;
            }
            let color = COLORS[color_index % COLORS.len()];
            let pts: Vec<(f64, f64)> = s
                .points
                .iter()
                .copied()
                .filter(|(x, y)| x.is_finite() && y.is_finite())
                .collect();
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
    }
    root.present().map_err(|e| anyhow!("{e}"))?;
    Ok(())
}
