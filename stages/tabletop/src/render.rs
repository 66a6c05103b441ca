//! The camera: a top-down RGB image of the table, drawn into a buffer the
//! caller owns (no allocation per frame).
//!
//! The frame is `size × size` pixels, row-major, 3 bytes (R, G, B) per pixel,
//! row 0 at the far edge of the table (y = 1), column 0 at its left edge
//! (x = 0); a pixel shows what lies under its centre, or under the task's
//! `area` camera ([`Camera`]) the mean colour over its square. Drawn in
//! order: the
//! table (brown), the cabinet (dark wood, an inner panel) with its open tray
//! (light wood) and black handle, plates (disc with a darker rim), then bowls
//! and blocks from low to high (a bowl is a dark rim around a lighter
//! inside; a cube is a square, a cylinder a disc, both grown by 0.35 pixel
//! under the point camera so that a small block never shrinks to a
//! sliver), and last the gripper:
//! two cyan fingers, 0.06 apart when open and 0.024 when closed (one blob at
//! 32 px), brighter the lower they are. Under the point camera thin parts
//! (handle, fingers) are at least one pixel wide at any size.
//!
//! ```
//! use embodyflow_tabletop::{Split, Suite, World, frame_len, generate};
//! let world = World::new(&generate(Suite::Spatial, Split::Train, 7, 0)).unwrap();
//! let mut frame = vec![0u8; frame_len(32)];
//! world.render(32, &mut frame).unwrap();
//! assert!(world.render(32, &mut frame[1..]).is_err());
//! ```

use crate::TabletopError;
use crate::scene::{CABINET_DEPTH, Camera, Colour, Kind, Shape};
use crate::world::{Body, Grip, World, Z_MAX};

/// The default frame size (pixels per side).
pub const DEFAULT_FRAME_SIZE: usize = 32;
/// Smallest frame size.
pub const MIN_FRAME_SIZE: usize = 8;
/// Largest frame size.
pub const MAX_FRAME_SIZE: usize = 512;

const TABLE: [u8; 3] = [128, 98, 70];
const CABINET: [u8; 3] = [84, 54, 34];
const CABINET_PANEL: [u8; 3] = [104, 70, 44];
const TRAY: [u8; 3] = [196, 160, 112];
const TRAY_FLOOR: [u8; 3] = [170, 134, 90];
const HANDLE: [u8; 3] = [16, 16, 16];

/// Bytes of a frame of `size × size` pixels.
pub fn frame_len(size: usize) -> usize {
    size * size * 3
}

/// Sub-samples per side of a pixel under the `area` camera.
const AREA_SAMPLES: usize = 8;

/// A frame under construction.
struct Canvas<'a> {
    px: &'a mut [u8],
    size: usize,
    scale: f32,
    camera: Camera,
}

impl Canvas<'_> {
    /// Paints `rgb` over the part of the box `lo..hi` that satisfies
    /// `inside`: on every pixel whose centre it holds (`point`), or blended
    /// into every pixel by the share of its `AREA_SAMPLES²` sub-samples it
    /// holds (`area`).
    fn fill(
        &mut self,
        lo: [f32; 2],
        hi: [f32; 2],
        rgb: [u8; 3],
        inside: impl Fn(f32, f32) -> bool,
    ) {
        let s = self.scale;
        let n = self.size as isize;
        let (c0, c1, r0, r1) = match self.camera {
            Camera::Point => (
                (lo[0] * s - 0.5).ceil() as isize,
                (hi[0] * s - 0.5).floor() as isize + 1,
                ((1.0 - hi[1]) * s - 0.5).ceil() as isize,
                ((1.0 - lo[1]) * s - 0.5).floor() as isize + 1,
            ),
            Camera::Area => (
                (lo[0] * s).floor() as isize,
                (hi[0] * s).ceil() as isize,
                ((1.0 - hi[1]) * s).floor() as isize,
                ((1.0 - lo[1]) * s).ceil() as isize,
            ),
        };
        let (c0, c1, r0, r1) = (
            c0.clamp(0, n),
            c1.clamp(0, n),
            r0.clamp(0, n),
            r1.clamp(0, n),
        );
        for row in r0..r1 {
            let base = row as usize * self.size;
            for col in c0..c1 {
                let cover = match self.camera {
                    Camera::Point => {
                        let (x, y) = ((col as f32 + 0.5) / s, 1.0 - (row as f32 + 0.5) / s);
                        if inside(x, y) { 1.0 } else { 0.0 }
                    }
                    Camera::Area => area_cover(col, row, s, &|x, y| {
                        (lo[0]..=hi[0]).contains(&x) && (lo[1]..=hi[1]).contains(&y) && inside(x, y)
                    }),
                };
                if cover > 0.0 {
                    let at = (base + col as usize) * 3;
                    for (c, &v) in self.px[at..at + 3].iter_mut().zip(&rgb) {
                        let mixed = f32::from(*c) * (1.0 - cover) + f32::from(v) * cover;
                        *c = mixed.round() as u8;
                    }
                }
            }
        }
    }

    fn rect(&mut self, lo: [f32; 2], hi: [f32; 2], rgb: [u8; 3]) {
        self.fill(lo, hi, rgb, |_, _| true);
    }

    fn disc(&mut self, c: [f32; 2], r: f32, rgb: [u8; 3]) {
        let r2 = r * r;
        self.fill([c[0] - r, c[1] - r], [c[0] + r, c[1] + r], rgb, |x, y| {
            let (dx, dy) = (x - c[0], y - c[1]);
            dx * dx + dy * dy <= r2
        });
    }

    /// Under the `point` camera blocks are drawn 0.35 pixel larger than
    /// their footprint, so a small block covers about the same pixels
    /// wherever it lies; the `area` camera draws the footprint.
    fn block_pad(&self) -> f32 {
        match self.camera {
            Camera::Point => 0.35 / self.scale,
            Camera::Area => 0.0,
        }
    }

    /// Under the `point` camera half a pixel at least, so a thin part
    /// always covers a pixel centre; the `area` camera draws it at its
    /// width, fainter where it covers less than a pixel.
    fn at_least_a_pixel(&self, half: f32) -> f32 {
        match self.camera {
            Camera::Point => half.max(0.5 / self.scale),
            Camera::Area => half,
        }
    }
}

/// The share of pixel (`col`, `row`)'s `AREA_SAMPLES²` sub-samples (at
/// the centres of a regular grid over its square) that lie `inside`.
fn area_cover(col: isize, row: isize, scale: f32, inside: &impl Fn(f32, f32) -> bool) -> f32 {
    let n = AREA_SAMPLES;
    let mut hits = 0usize;
    for i in 0..n {
        let y = 1.0 - (row as f32 + (i as f32 + 0.5) / n as f32) / scale;
        for j in 0..n {
            let x = (col as f32 + (j as f32 + 0.5) / n as f32) / scale;
            hits += usize::from(inside(x, y));
        }
    }
    hits as f32 / (n * n) as f32
}

fn shade(rgb: [u8; 3], f: f32) -> [u8; 3] {
    rgb.map(|c| (f32::from(c) * f).min(255.0) as u8)
}

fn lighten(rgb: [u8; 3], t: f32) -> [u8; 3] {
    rgb.map(|c| (f32::from(c) + (255.0 - f32::from(c)) * t) as u8)
}

impl World {
    /// Draws the scene into `frame` (`frame_len(size)` bytes; see the
    /// module doc for the layout).
    pub fn render(&self, size: usize, frame: &mut [u8]) -> Result<(), TabletopError> {
        if !(MIN_FRAME_SIZE..=MAX_FRAME_SIZE).contains(&size) {
            return Err(TabletopError::FrameSize {
                size,
                min: MIN_FRAME_SIZE,
                max: MAX_FRAME_SIZE,
            });
        }
        if frame.len() != frame_len(size) {
            return Err(TabletopError::FrameBuffer {
                size,
                expected: frame_len(size),
                found: frame.len(),
            });
        }
        for px in frame.chunks_exact_mut(3) {
            px.copy_from_slice(&TABLE);
        }
        let mut canvas = Canvas {
            px: frame,
            size,
            scale: size as f32,
            camera: self.camera(),
        };
        let bodies = self.bodies();
        for b in bodies.iter().filter(|b| b.kind == Kind::Drawer) {
            draw_drawer(&mut canvas, b);
        }
        for b in bodies.iter().filter(|b| b.kind == Kind::Plate) {
            canvas.disc(b.pos, b.radius, shade(b.colour.rgb(), 0.7));
            canvas.disc(b.pos, b.radius * 0.8, b.colour.rgb());
        }
        // Movable objects from low to high; a bowl before a block at the
        // same height.
        let mut order = [0usize; 8];
        let mut n = 0;
        for (i, b) in bodies.iter().enumerate() {
            if b.kind.movable() {
                order[n] = i;
                n += 1;
            }
        }
        let key = |i: usize| (bodies[i].z, u8::from(bodies[i].kind == Kind::Block));
        order[..n].sort_by(|&a, &b| {
            key(a)
                .partial_cmp(&key(b))
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        for &i in &order[..n] {
            draw_movable(&mut canvas, &bodies[i]);
        }
        let g = self.gripper();
        let gap = if g.grip == Grip::Open { 0.03 } else { 0.012 };
        let t = (g.pos[2] / Z_MAX).clamp(0.0, 1.0);
        let finger = [0, (255.0 - 120.0 * t) as u8, (255.0 - 120.0 * t) as u8];
        let half = canvas.at_least_a_pixel(0.01);
        for side in [-1.0f32, 1.0] {
            let c = [g.pos[0] + side * gap, g.pos[1]];
            canvas.rect(
                [c[0] - half, c[1] - half],
                [c[0] + half, c[1] + half],
                finger,
            );
        }
        Ok(())
    }
}

fn draw_drawer(canvas: &mut Canvas<'_>, b: &Body) {
    let (x, y, r) = (b.pos[0], b.pos[1], b.radius);
    let d = CABINET_DEPTH / 2.0;
    canvas.rect([x - r, y - d], [x + r, y + d], CABINET);
    canvas.rect(
        [x - r + 0.02, y - d + 0.02],
        [x + r - 0.02, y + d - 0.02],
        CABINET_PANEL,
    );
    if b.open > 0.0 {
        let (lo, hi) = b.tray();
        canvas.rect([lo[0] - 0.01, lo[1]], [hi[0] + 0.01, hi[1]], TRAY);
        canvas.rect([lo[0], lo[1] + 0.012], hi, TRAY_FLOOR);
    }
    let h = b.handle();
    let half = canvas.at_least_a_pixel(0.008);
    canvas.rect(
        [h[0] - 0.05, h[1] - half],
        [h[0] + 0.05, h[1] + half],
        HANDLE,
    );
}

fn draw_movable(canvas: &mut Canvas<'_>, b: &Body) {
    let rgb = b.colour.rgb();
    match (b.kind, b.shape) {
        (Kind::Bowl, _) => {
            let rim = if b.colour == Colour::Black {
                [70, 70, 70]
            } else {
                shade(rgb, 0.6)
            };
            canvas.disc(b.pos, b.radius, rim);
            canvas.disc(b.pos, b.radius * 0.72, lighten(rgb, 0.3));
        }
        (_, Shape::Cube) => {
            let r = b.radius + canvas.block_pad();
            canvas.rect(
                [b.pos[0] - r, b.pos[1] - r],
                [b.pos[0] + r, b.pos[1] + r],
                rgb,
            );
        }
        (_, Shape::Cylinder) => canvas.disc(b.pos, b.radius + canvas.block_pad(), rgb),
    }
}
