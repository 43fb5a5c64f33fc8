//! PNG line plots with plotters' bitmap backend. Text is drawn from the public-domain 8x8
//! bitmap font of `font8x8`, so no system font is needed.
use std::path::Path;

use font8x8::UnicodeFonts;
use plotters::prelude::*;

/// One line: (x seconds, y count) points.
#[derive(Debug, Clone)]
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, u32)>,
}

const WIDTH: u32 = 1000;
const HEIGHT: u32 = 600;
const LEFT: i32 = 90;
const RIGHT: i32 = 30;
const TOP: i32 = 50;
const BOTTOM: i32 = 70;
/// Pixels per font pixel.
const TEXT_SCALE: i32 = 2;
const COLORS: [RGBColor; 8] = [
    RGBColor(214, 39, 40),
    RGBColor(255, 127, 14),
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

/// Writes `series` (x: seconds since `origin`, y: executors Running) to `path` as a PNG.
pub fn running_over_time(
    path: &Path,
    title: &str,
    origin: &str,
    series: &[Series],
) -> anyhow::Result<()> {
    let root = BitMapBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    draw(&root, title, origin, series)
        .map_err(|e| anyhow::anyhow!("plot {}: {e}", path.display()))?;
    root.present()
        .map_err(|e| anyhow::anyhow!("plot {}: {e}", path.display()))?;
    Ok(())
}

type Area<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;
type DrawResult =
    Result<(), DrawingAreaErrorKind<<BitMapBackend<'static> as DrawingBackend>::ErrorType>>;

fn draw(root: &Area<'_>, title: &str, origin: &str, series: &[Series]) -> DrawResult {
    root.fill(&WHITE)?;
    let max_x = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .fold(1.0_f64, f64::max);
    let max_y = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .max()
        .unwrap_or(1)
        .max(1);
    let (x_step, x_end) = nice_axis(max_x);
    let (y_step, y_end) = nice_axis(f64::from(max_y));
    let plot_w = WIDTH as i32 - LEFT - RIGHT;
    let plot_h = HEIGHT as i32 - TOP - BOTTOM;
    let px = |x: f64| LEFT + (x / x_end * f64::from(plot_w)).round() as i32;
    let py = |y: f64| TOP + plot_h - (y / y_end * f64::from(plot_h)).round() as i32;

    // Grid, ticks and their labels.
    let grid = RGBColor(225, 225, 225);
    let mut x = 0.0;
    while x <= x_end + 1e-9 {
        root.draw(&PathElement::new(
            vec![(px(x), TOP), (px(x), TOP + plot_h)],
            grid,
        ))?;
        let label = format_tick(x);
        text(
            root,
            &label,
            px(x) - width_of(&label) / 2,
            TOP + plot_h + 8,
            &BLACK,
        )?;
        x += x_step;
    }
    let mut y = 0.0;
    while y <= y_end + 1e-9 {
        root.draw(&PathElement::new(
            vec![(LEFT, py(y)), (LEFT + plot_w, py(y))],
            grid,
        ))?;
        let label = format_tick(y);
        text(root, &label, LEFT - 8 - width_of(&label), py(y) - 8, &BLACK)?;
        y += y_step;
    }
    root.draw(&Rectangle::new(
        [(LEFT, TOP), (LEFT + plot_w, TOP + plot_h)],
        BLACK,
    ))?;
    text(root, title, (WIDTH as i32 - width_of(title)) / 2, 6, &BLACK)?;
    let x_title = format!("seconds since {origin}");
    let x_title = x_title.as_str();
    text(
        root,
        x_title,
        LEFT + (plot_w - width_of(x_title)) / 2,
        HEIGHT as i32 - 30,
        &BLACK,
    )?;
    text(root, "Running", 8, TOP - 24, &BLACK)?;

    // Lines, then the legend over a white box.
    for (index, s) in series.iter().enumerate() {
        let color = COLORS[index % COLORS.len()];
        let points: Vec<(i32, i32)> = s
            .points
            .iter()
            .map(|(x, y)| (px(*x), py(f64::from(*y))))
            .collect();
        root.draw(&PathElement::new(points, color.stroke_width(2)))?;
    }
    let legend_width = series.iter().map(|s| width_of(&s.label)).max().unwrap_or(0) + 60;
    let legend_height = series.len() as i32 * 22 + 10;
    root.draw(&Rectangle::new(
        [
            (LEFT + 6, TOP + 6),
            (LEFT + 6 + legend_width, TOP + 6 + legend_height),
        ],
        WHITE.filled(),
    ))?;
    for (index, s) in series.iter().enumerate() {
        let color = COLORS[index % COLORS.len()];
        let row = TOP + 14 + index as i32 * 22;
        root.draw(&Rectangle::new(
            [(LEFT + 14, row + 4), (LEFT + 40, row + 9)],
            color.filled(),
        ))?;
        text(root, &s.label, LEFT + 48, row, &BLACK)?;
    }
    Ok(())
}

/// A step of 1, 2 or 5 × 10^k giving 4 to 10 ticks, and the axis end (a multiple of it).
fn nice_axis(max: f64) -> (f64, f64) {
    let raw = max / 5.0;
    let magnitude = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * magnitude);
    (step, (max / step).ceil().max(1.0) * step)
}

fn format_tick(v: f64) -> String {
    if v.fract().abs() < 1e-9 {
        format!("{}", v as i64)
    } else {
        format!("{v:.1}")
    }
}

fn width_of(s: &str) -> i32 {
    s.chars().count() as i32 * 8 * TEXT_SCALE
}

/// `s` with its top-left corner at (x, y), each font pixel a TEXT_SCALE square.
fn text(root: &Area<'_>, s: &str, x: i32, y: i32, color: &RGBColor) -> DrawResult {
    for (i, c) in s.chars().enumerate() {
        let Some(glyph) = font8x8::BASIC_FONTS.get(c) else {
            continue;
        };
        let left = x + i as i32 * 8 * TEXT_SCALE;
        for (row, bits) in glyph.iter().enumerate() {
            for col in 0..8 {
                if bits & (1 << col) != 0 {
                    let x0 = left + col * TEXT_SCALE;
                    let y0 = y + row as i32 * TEXT_SCALE;
                    root.draw(&Rectangle::new(
                        [(x0, y0), (x0 + TEXT_SCALE - 1, y0 + TEXT_SCALE - 1)],
                        color.filled(),
                    ))?;
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axes_end_on_a_round_step() {
        assert_eq!(nice_axis(1000.0), (200.0, 1000.0));
        assert_eq!(nice_axis(23.0), (5.0, 25.0));
        assert_eq!(nice_axis(199.0), (50.0, 200.0));
    }

    #[test]
    fn a_plot_is_a_png_of_the_size_asked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.png");
        let series = vec![Series {
            label: "a".into(),
            points: vec![(0.0, 0), (1.0, 5), (2.0, 10)],
        }];
        running_over_time(&path, "title", "the start", &series).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        // IHDR: width and height, big-endian, at bytes 16..24.
        assert_eq!(u32::from_be_bytes(bytes[16..20].try_into().unwrap()), WIDTH);
        assert_eq!(
            u32::from_be_bytes(bytes[20..24].try_into().unwrap()),
            HEIGHT
        );
    }
}
