//! The command line of the training examples: `--blocks`, `--width`, `--batch` and `--steps`, as
//! `--name value` pairs of whole numbers.
//!
//! Shared by `examples/checkpointed_training.rs` and `examples/custom_op.rs` through `#[path]`.

/// The sizes of a training example's run.
pub(crate) struct Args {
    pub(crate) blocks: usize,
    pub(crate) width: usize,
    pub(crate) batch: usize,
    pub(crate) steps: usize,
}

impl Args {
    /// These sizes with those the command line gives instead. Exits with a message naming the
    /// argument at fault for an unknown name or a value that is not a whole number.
    pub(crate) fn or_command_line(mut self) -> Args {
        let raw: Vec<String> = std::env::args().skip(1).collect();
        let fail = |message: String| -> ! {
            eprintln!("{message}");
            std::process::exit(2)
        };
        for pair in raw.chunks(2) {
            let slot = match pair[0].as_str() {
                "--blocks" => &mut self.blocks,
                "--width" => &mut self.width,
                "--batch" => &mut self.batch,
                "--steps" => &mut self.steps,
                other => fail(format!(
                    "unknown argument {other}; accepted: --blocks --width --batch --steps"
                )),
            };
            *slot = pair
                .get(1)
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| fail(format!("{} needs a whole number", pair[0])));
        }
        self
    }
}
