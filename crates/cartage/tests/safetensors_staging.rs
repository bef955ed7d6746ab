//! Loading streams through bounded staging memory (R18): loading a file four times larger than
//! the staging buffer, onto every device under test, never raises the process's pinned-memory
//! peak by more than one staging buffer, and returns all of it afterwards. Alone in its binary
//! (and the file is written without cartage) so that nothing else moves the pinned counters.

mod memory_support;

use cartage::safetensors_io::STAGING_BYTES;
use cartage::{load_safetensors, pinned_bytes_in_use, pinned_bytes_peak};
use memory_support::{devices_under_test, temp_path};

/// A safetensors file of one f32 tensor `0, 1, 2, …` of `n` elements, written by hand.
fn write_file(n: usize) -> memory_support::TempFile {
    let json = format!(
        r#"{{"x":{{"dtype":"F32","shape":[{n}],"data_offsets":[0,{}]}}}}"#,
        4 * n
    );
    let mut header = json.into_bytes();
    header.resize(header.len().next_multiple_of(8), b' ');
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend(&header);
    bytes.extend((0..n).flat_map(|i| (i as f32).to_le_bytes()));
    let path = temp_path("staging.safetensors");
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn loading_holds_at_most_one_staging_buffer_of_pinned_memory() {
    let n = STAGING_BYTES; // 4 × STAGING_BYTES of f32 data
    let path = write_file(n);
    let devices = devices_under_test("safetensors_staging");
    let baseline = pinned_bytes_peak();
    // Load onto every device first: reading back afterwards may use a backend's own pinned
    // staging (CUDA's synchronous copies do), which must not count against loading.
    let mut loaded = Vec::new();
    for device in devices {
        let in_use = pinned_bytes_in_use();
        let peak_before = pinned_bytes_peak();
        let tensors = load_safetensors(&path, &device).unwrap();
        let peak = pinned_bytes_peak();
        println!(
            "{device}: loaded {} MiB; pinned peak {peak} bytes (baseline {baseline}, staging limit {STAGING_BYTES})",
            (4 * n) >> 20
        );
        // Devices that can lock memory stage through pinned memory; the others through ordinary
        // memory, which must not show up as pinned.
        let pins = cartage::alloc_staging(&device, 1).unwrap().is_pinned();
        if pins {
            assert!(peak > baseline || baseline > 0, "{device}: no pinned staging was used");
        } else {
            assert_eq!(peak, peak_before, "{device}: pageable staging was counted as pinned");
        }
        assert!(
            peak - baseline <= STAGING_BYTES as u64,
            "{device}: pinned peak grew by {}",
            peak - baseline
        );
        assert_eq!(
            pinned_bytes_in_use(),
            in_use,
            "{device}: staging memory was not returned"
        );
        loaded.push((device, tensors));
    }
    for (device, tensors) in loaded {
        let values = tensors["x"].to_vec::<f32>().unwrap();
        assert!(
            values.iter().enumerate().all(|(i, &v)| v == i as f32),
            "{device}: data corrupted"
        );
    }
}
