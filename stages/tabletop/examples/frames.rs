//! Renders the first state of one task per suite, and the state halfway
//! through its expert episode, as PNG files: `cargo run --release --example
//! frames -- OUT_DIR [SIZE]` (SIZE defaults to 48). Look at them to check
//! that objects are recognisable.
use std::fs::File;
use std::io::BufWriter;
use std::path::PathBuf;

use embodyflow_tabletop::{
    Expert, ExpertConfig, Split, Status, Strategy, Suite, World, frame_len, generate,
};

fn write_png(path: &PathBuf, size: usize, frame: &[u8]) -> Result<(), Box<dyn std::error::Error>> {
    let mut encoder = png::Encoder::new(
        BufWriter::new(File::create(path)?),
        size as u32,
        size as u32,
    );
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    encoder.write_header()?.write_image_data(frame)?;
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let out = PathBuf::from(args.next().ok_or("usage: frames OUT_DIR [SIZE]")?);
    let size: usize = args.next().map_or(Ok(48), |s| s.parse())?;
    std::fs::create_dir_all(&out)?;
    let mut frame = vec![0u8; frame_len(size)];
    for suite in Suite::ALL {
        let task = generate(suite, Split::Train, 7, 1);
        let mut world = World::new(&task)?;
        world.render(size, &mut frame)?;
        write_png(&out.join(format!("{suite}-start.png")), size, &frame)?;
        let mut expert = Expert::new(&world, Strategy::Grasp, ExpertConfig::default())?;
        let mut steps = 0;
        while world.status() == Status::Running {
            let action = expert.act(&world);
            world.step(&action)?;
            steps += 1;
            if steps == 25 {
                world.render(size, &mut frame)?;
                write_png(&out.join(format!("{suite}-step25.png")), size, &frame)?;
            }
        }
        world.render(size, &mut frame)?;
        write_png(&out.join(format!("{suite}-end.png")), size, &frame)?;
        println!(
            "{suite}: {} -> {:?} after {} steps",
            task.instruction,
            world.status(),
            world.steps()
        );
    }
    Ok(())
}
