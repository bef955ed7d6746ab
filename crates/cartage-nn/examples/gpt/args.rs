//! The command line: `--name value` flags with the model size as defaults.

use std::path::PathBuf;

use anyhow::{Context, bail};

/// How the forward pass runs: `--autocast bf16|f16|off|auto`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    /// bf16 on CUDA, f32 elsewhere.
    Auto,
    /// Matmuls and attention in bf16 under `cartage::autocast`.
    Bf16,
    /// Matmuls and attention in f16 under `cartage::autocast`, with a `GradScaler`.
    F16,
    /// Everything in f32.
    Off,
}

/// What to train and how; see [`USAGE`].
#[derive(Clone, Debug)]
pub struct Args {
    pub layers: usize,
    pub dim: usize,
    pub heads: usize,
    pub context: usize,
    pub batch: usize,
    pub steps: usize,
    pub lr: f64,
    pub eval_every: Option<usize>,
    pub eval_batches: usize,
    pub precision: Precision,
    pub out: PathBuf,
    pub prompt: String,
    pub generate: usize,
    pub temperature: f64,
    pub top_k: usize,
    pub seed: u64,
    /// `--device`: where to train (else `CARTAGE_DEVICE`, else the best device found).
    pub device: Option<String>,
    /// `--save`: a safetensors file for the trained parameters' state dict.
    pub save: Option<PathBuf>,
}

/// The help text (`--help`).
pub const USAGE: &str = "\
gpt: a character-level GPT trained on two Jane Austen novels (data/austen.txt)

flags (defaults in brackets):
  --layers N         transformer blocks [6]
  --dim N            model width [384]
  --heads N          attention heads [6]
  --context N        characters of context [256]
  --batch N          windows per batch [64]
  --steps N          optimizer steps [2000]
  --lr X             peak AdamW learning rate (warm-up, then cosine to a tenth) [1e-3]
  --eval-every N     steps between validation passes [steps / 10]
  --eval-batches N   validation batches per pass [8]
  --autocast MODE    bf16 | f16 (with a GradScaler) | off | auto (bf16 on CUDA, else off) [auto]
  --out DIR          where loss.svg and sample.txt go [target/gpt]
  --prompt TEXT      the start of the generated text [\"Elizabeth\"]
  --generate N       characters to generate [300]
  --temperature X    sampling temperature [0.8]
  --top-k N          sample among the N likeliest characters, 0 for all [0]
  --seed N           initialisation, batches and sampling [0]
  --device DEV       cpu, cuda:N or wgpu:N [CARTAGE_DEVICE, else the best device found]
  --save FILE        write the trained parameters as a safetensors state dict [not written]";

impl Default for Args {
    fn default() -> Self {
        Args {
            layers: 6,
            dim: 384,
            heads: 6,
            context: 256,
            batch: 64,
            steps: 2000,
            lr: 1e-3,
            eval_every: None,
            eval_batches: 8,
            precision: Precision::Auto,
            out: PathBuf::from("target/gpt"),
            prompt: "Elizabeth".into(),
            generate: 300,
            temperature: 0.8,
            top_k: 0,
            seed: 0,
            device: None,
            save: None,
        }
    }
}

impl Args {
    /// Parse `--name value` pairs; `None` when `--help` was asked for.
    pub fn parse(mut argv: impl Iterator<Item = String>) -> anyhow::Result<Option<Args>> {
        let mut args = Args::default();
        while let Some(flag) = argv.next() {
            if flag == "--help" || flag == "-h" {
                return Ok(None);
            }
            let value = argv
                .next()
                .with_context(|| format!("`{flag}` needs a value (see --help)"))?;
            args.set(&flag, &value)?;
        }
        args.check()?;
        Ok(Some(args))
    }

    /// The validation interval: `--eval-every`, else a tenth of the run.
    pub fn eval_every(&self) -> usize {
        self.eval_every.unwrap_or(self.steps / 10).max(1)
    }

    fn set(&mut self, flag: &str, value: &str) -> anyhow::Result<()> {
        match flag {
            "--layers" => self.layers = number(flag, value)?,
            "--dim" => self.dim = number(flag, value)?,
            "--heads" => self.heads = number(flag, value)?,
            "--context" => self.context = number(flag, value)?,
            "--batch" => self.batch = number(flag, value)?,
            "--steps" => self.steps = number(flag, value)?,
            "--lr" => self.lr = number(flag, value)?,
            "--eval-every" => self.eval_every = Some(number(flag, value)?),
            "--eval-batches" => self.eval_batches = number(flag, value)?,
            "--autocast" => self.precision = precision(value)?,
            "--out" => self.out = PathBuf::from(value),
            "--prompt" => self.prompt = value.to_string(),
            "--generate" => self.generate = number(flag, value)?,
            "--temperature" => self.temperature = number(flag, value)?,
            "--top-k" => self.top_k = number(flag, value)?,
            "--seed" => self.seed = number(flag, value)?,
            "--device" => self.device = Some(value.to_string()),
            "--save" => self.save = Some(PathBuf::from(value)),
            _ => bail!("unknown flag `{flag}` (see --help)"),
        }
        Ok(())
    }

    /// Sizes that cannot train: zero counts, and a width the heads do not divide.
    fn check(&self) -> anyhow::Result<()> {
        let counts = [
            ("--layers", self.layers),
            ("--dim", self.dim),
            ("--heads", self.heads),
            ("--context", self.context),
            ("--batch", self.batch),
            ("--steps", self.steps),
            ("--eval-batches", self.eval_batches),
        ];
        if let Some((flag, _)) = counts.iter().find(|(_, n)| *n == 0) {
            bail!("`{flag}` must be at least 1");
        }
        if !self.dim.is_multiple_of(self.heads) {
            bail!("`--dim {}` must be a multiple of `--heads {}`", self.dim, self.heads);
        }
        if !(self.lr > 0.0 && self.temperature > 0.0) {
            bail!("`--lr` and `--temperature` must be positive");
        }
        Ok(())
    }
}

fn number<T: std::str::FromStr>(flag: &str, value: &str) -> anyhow::Result<T>
where
    T::Err: std::error::Error + Send + Sync + 'static,
{
    value
        .parse()
        .with_context(|| format!("`{flag} {value}`: not a valid number"))
}

fn precision(value: &str) -> anyhow::Result<Precision> {
    Ok(match value {
        "auto" => Precision::Auto,
        "bf16" => Precision::Bf16,
        "f16" => Precision::F16,
        "off" | "f32" => Precision::Off,
        _ => bail!("`--autocast {value}`: expected bf16, f16, off or auto"),
    })
}
