//! The text: its character vocabulary, the train/validation split, the unigram baseline, and
//! the (context, next character) windows that make a batch.

use std::sync::Arc;

use anyhow::{Context, ensure};
use cartage::HostBatch;

/// The corpus file, relative to the crate.
const PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/data/austen.txt");

/// The text as token ids, split into the first 90% (training) and the last 10% (validation).
pub struct Corpus {
    /// Token id → the byte it stands for (the bytes that occur, in order).
    vocab: Vec<u8>,
    /// Byte → token id (`u8::MAX` for a byte that does not occur).
    ids: [u8; 256],
    /// The training ids.
    pub train: Arc<[u8]>,
    /// The validation ids.
    pub val: Arc<[u8]>,
}

impl Corpus {
    /// Read `data/austen.txt` and hold out its last 10% for validation.
    pub fn load() -> anyhow::Result<Corpus> {
        let text = std::fs::read(PATH).with_context(|| format!("reading the corpus {PATH}"))?;
        Corpus::from_text(&text)
    }

    /// The corpus of `text` (bytes; the vocabulary is the bytes that occur in it).
    pub fn from_text(text: &[u8]) -> anyhow::Result<Corpus> {
        let mut seen = [false; 256];
        text.iter().for_each(|&b| seen[b as usize] = true);
        let vocab: Vec<u8> = (0..=255u8).filter(|&b| seen[b as usize]).collect();
        ensure!(
            vocab.len() < 256,
            "the corpus uses every byte value; a byte-level vocabulary needs u16 ids"
        );
        let mut ids = [u8::MAX; 256];
        for (id, &b) in vocab.iter().enumerate() {
            ids[b as usize] = id as u8;
        }
        let tokens: Vec<u8> = text.iter().map(|&b| ids[b as usize]).collect();
        let split = tokens.len() * 9 / 10;
        Ok(Corpus {
            vocab,
            ids,
            train: tokens[..split].into(),
            val: tokens[split..].into(),
        })
    }

    /// Number of distinct characters.
    pub fn vocab_size(&self) -> usize {
        self.vocab.len()
    }

    /// The ids of `text`; a character the corpus never uses is an error naming it.
    pub fn encode(&self, text: &str) -> anyhow::Result<Vec<u8>> {
        text.bytes()
            .map(|b| match self.ids[b as usize] {
                u8::MAX => anyhow::bail!(
                    "the prompt's byte {b:#04x} ({:?}) never occurs in the corpus",
                    b as char
                ),
                id => Ok(id),
            })
            .collect()
    }

    /// The text of `ids` (invalid UTF-8 replaced, which an ASCII corpus never produces).
    pub fn decode(&self, ids: &[u8]) -> String {
        let bytes: Vec<u8> = ids.iter().map(|&id| self.vocab[id as usize]).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The entropy of the training text's character frequencies, in nats per character: the
    /// loss of the best model that ignores context. A trained model must get well below it.
    pub fn unigram_entropy(&self) -> f64 {
        let mut counts = vec![0usize; self.vocab.len()];
        self.train.iter().for_each(|&id| counts[id as usize] += 1);
        let n = self.train.len() as f64;
        counts
            .iter()
            .filter(|&&c| c > 0)
            .map(|&c| {
                let p = c as f64 / n;
                -p * p.ln()
            })
            .sum()
    }
}

/// A small xorshift generator for the host side: window positions and sampling.
pub struct HostRng(u64);

impl HostRng {
    /// A generator from `seed` (any value, zero included).
    pub fn new(seed: u64) -> HostRng {
        HostRng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number in `[0, n)`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// A number in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// One batch `[2, starts.len(), context]` of i32: plane 0 holds the windows `ids[s..s + context]`,
/// plane 1 the same windows shifted by one (each position's next character).
fn windows(ids: &[u8], starts: &[usize], context: usize) -> HostBatch {
    let mut values = Vec::with_capacity(2 * starts.len() * context);
    for shift in 0..2 {
        for &s in starts {
            values.extend(ids[s + shift..s + shift + context].iter().map(|&id| i32::from(id)));
        }
    }
    HostBatch::new(values, &[2, starts.len(), context])
}

/// `steps` training batches of `batch` windows at random positions, made lazily (the loader's
/// worker thread draws them while the device computes).
pub fn training_batches(
    ids: Arc<[u8]>,
    batch: usize,
    context: usize,
    steps: usize,
    seed: u64,
) -> anyhow::Result<impl Iterator<Item = HostBatch> + Send + 'static> {
    let last = last_start(&ids, context, "training")?;
    let mut rng = HostRng::new(seed);
    Ok((0..steps).map(move |_| {
        let starts: Vec<usize> = (0..batch).map(|_| rng.below(last + 1)).collect();
        windows(&ids, &starts, context)
    }))
}

/// `count` validation batches of `batch` windows spread evenly over the validation text: the
/// same windows at every evaluation, so the losses compare.
pub fn validation_batches(ids: &[u8], batch: usize, context: usize, count: usize) -> anyhow::Result<Vec<HostBatch>> {
    let last = last_start(ids, context, "validation")?;
    let total = batch * count;
    let stride = last / total;
    let starts: Vec<usize> = (0..total).map(|i| i * stride).collect();
    Ok(starts.chunks(batch).map(|chunk| windows(ids, chunk, context)).collect())
}

/// The last position a window (plus its next character) can start at.
fn last_start(ids: &[u8], context: usize, split: &str) -> anyhow::Result<usize> {
    ensure!(
        ids.len() > context + 1,
        "the {split} text has {} characters, too few for a context of {context}",
        ids.len()
    );
    Ok(ids.len() - context - 1)
}
