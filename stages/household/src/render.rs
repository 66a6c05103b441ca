//! The scene image of a household task: a top-down map of its initial
//! state, for a vision-language planner that reads an image beside the
//! instruction.
//!
//! The image is `size × size` pixels, row-major, 3 bytes (R, G, B) per pixel,
//! drawn the way the tabletop camera draws its frames (a pixel shows what
//! lies under its centre, regions painted in order). The floor is a 4 × 4
//! grid of regions: receptacle `r` of the catalog ([`Receptacle::ALL`])
//! owns region `r` (row `r / 4`, column `r mod 4`), and the last region is
//! the doorway where the agent starts. Drawn in order:
//!
//! - the floor (grey), then each receptacle the scene has as a block in its
//!   region's colour, inset by a sixteenth of the region;
//! - an openable receptacle's door along the block's bottom edge: dark when
//!   it starts closed, light when open;
//! - the objects on a receptacle as square marks in a 3 × 3 grid inside its
//!   block, in the scene's order, each in its object type's colour (a
//!   receptacle holds at most [`MAX_OBJECTS`]: the ninth mark is never
//!   needed);
//! - the agent as a white square in the doorway (it starts at no
//!   receptacle, holding nothing).
//!
//! Everything is a function of the scene: the same task renders the same
//! bytes at any time. A region is `size / 4` pixels (the remainder of the
//! division stays floor at the right and bottom edges), so each mark is at
//! least one pixel at [`MIN_IMAGE_SIZE`].
//!
//! ```
//! use embodyflow_household::{Split, generate_tasks, render::{image_len, render}};
//! let task = &generate_tasks(Split::Train, 7, 1)[0];
//! let image = render(task, 64).unwrap();
//! assert_eq!(image.len(), image_len(64));
//! assert_eq!(image, render(task, 64).unwrap());
//! assert!(render(task, 8).is_err());
//! ```

use crate::HouseholdError;
use crate::task::Task;
use crate::world::{MAX_OBJECTS, Object, Receptacle};

/// The smallest image side: a mark of a region's 3 × 3 grid is then one
/// pixel.
pub const MIN_IMAGE_SIZE: usize = 32;
/// The largest image side.
pub const MAX_IMAGE_SIZE: usize = 1024;

/// Regions per side of the map.
const GRID: usize = 4;
/// Object marks per side of a receptacle's block.
const MARKS: usize = 3;

const FLOOR: [u8; 3] = [92, 92, 92];
const DOOR_CLOSED: [u8; 3] = [24, 24, 24];
const DOOR_OPEN: [u8; 3] = [236, 236, 236];
const AGENT: [u8; 3] = [255, 255, 255];

/// Each receptacle's colour, in catalog order.
const RECEPTACLE: [[u8; 3]; 14] = [
    [150, 190, 220], // Fridge
    [120, 120, 140], // Microwave
    [90, 150, 200],  // SinkBasin
    [170, 90, 70],   // StoveBurner
    [200, 180, 140], // CounterTop
    [160, 110, 60],  // DiningTable
    [130, 90, 50],   // Cabinet
    [180, 130, 80],  // Drawer
    [110, 80, 60],   // Shelf
    [140, 120, 90],  // Desk
    [100, 60, 110],  // Sofa
    [70, 100, 70],   // GarbageCan
    [190, 160, 200], // Bed
    [80, 80, 90],    // Safe
];

/// Bytes of an image of `size × size` pixels.
pub fn image_len(size: usize) -> usize {
    size * size * 3
}

/// Object type `o`'s colour: hues around the wheel in catalog order, at
/// full saturation, alternating two brightnesses so neighbours differ.
fn object_colour(object: Object) -> [u8; 3] {
    let i = object.index();
    let hue = i * 360 / Object::ALL.len();
    let value: u32 = if i % 2 == 0 { 255 } else { 190 };
    // The piecewise-linear RGB of a hue (HSV with full saturation).
    let sector = (hue / 60) as u32;
    let rising = value * (hue % 60) as u32 / 60;
    let falling = value - rising;
    let [r, g, b] = match sector {
        0 => [value, rising, 0],
        1 => [falling, value, 0],
        2 => [0, value, rising],
        3 => [0, falling, value],
        4 => [rising, 0, value],
        _ => [value, 0, falling],
    };
    [r as u8, g as u8, b as u8]
}

/// An image under construction.
struct Canvas {
    px: Vec<u8>,
    size: usize,
}

impl Canvas {
    /// Paints `rgb` on the pixels of rows `rows` and columns `cols`.
    fn rect(&mut self, rows: std::ops::Range<usize>, cols: std::ops::Range<usize>, rgb: [u8; 3]) {
        for row in rows {
            for col in cols.clone() {
                let at = (row * self.size + col) * 3;
                self.px[at..at + 3].copy_from_slice(&rgb);
            }
        }
    }
}

/// Region `index`'s pixel rows and columns, inset by `inset` pixels.
fn region(
    index: usize,
    cell: usize,
    inset: usize,
) -> (std::ops::Range<usize>, std::ops::Range<usize>) {
    let (row, col) = (index / GRID, index % GRID);
    (
        row * cell + inset..(row + 1) * cell - inset,
        col * cell + inset..(col + 1) * cell - inset,
    )
}

/// Whether the renderer draws images of side `size`: an error naming it
/// when not.
pub fn check_size(size: usize) -> Result<(), HouseholdError> {
    if (MIN_IMAGE_SIZE..=MAX_IMAGE_SIZE).contains(&size) {
        Ok(())
    } else {
        Err(HouseholdError::ImageSize {
            size,
            min: MIN_IMAGE_SIZE,
            max: MAX_IMAGE_SIZE,
        })
    }
}

/// The scene image of `task` at `size × size` (see the module doc); a
/// size outside `MIN_IMAGE_SIZE..=MAX_IMAGE_SIZE` is an error naming it.
pub fn render(task: &Task, size: usize) -> Result<Vec<u8>, HouseholdError> {
    check_size(size)?;
    let mut canvas = Canvas {
        px: FLOOR.repeat(size * size),
        size,
    };
    let cell = size / GRID;
    let inset = cell / 16;
    for spot in &task.scene.receptacles {
        let index = spot.receptacle.index();
        let (rows, cols) = region(index, cell, inset);
        canvas.rect(rows.clone(), cols.clone(), RECEPTACLE[index]);
        if spot.receptacle.openable() {
            let door = if spot.open { DOOR_OPEN } else { DOOR_CLOSED };
            let thick = (cell / 12).max(1);
            canvas.rect(rows.end - thick..rows.end, cols.clone(), door);
        }
        let step = rows.len() / MARKS;
        let side = (step / 2).max(1);
        let on: Vec<Object> = task
            .scene
            .objects
            .iter()
            .filter(|o| o.on == spot.receptacle)
            .map(|o| o.object)
            .collect();
        debug_assert!(on.len() <= MAX_OBJECTS.min(MARKS * MARKS));
        for (k, &object) in on.iter().enumerate().take(MARKS * MARKS) {
            let top = rows.start + (k / MARKS) * step + (step - side) / 2;
            let left = cols.start + (k % MARKS) * step + (step - side) / 2;
            canvas.rect(top..top + side, left..left + side, object_colour(object));
        }
    }
    let (rows, cols) = region(GRID * GRID - 1, cell, cell / 3);
    canvas.rect(rows, cols, AGENT);
    debug_assert_eq!(Receptacle::ALL.len(), RECEPTACLE.len());
    Ok(canvas.px)
}
