//! Safetensors onto a device (R18): every dtype round-trips on every device under test (and
//! across devices), strided views save their elements, large tensors stream through staging,
//! bad and hostile files are typed errors, saving replaces a file only once the new one is
//! complete, metadata round-trips, subsets load by name, and files interoperate with the Python
//! `safetensors` package.

mod memory_support;

use std::collections::HashMap;

use cartage::safetensors_io::{SafetensorsFile, save_safetensors_with_metadata};
use cartage::{DType, Device, Error, Op, Tensor, backend, load_safetensors, save_safetensors};
use half::{bf16, f16};
use memory_support::{TempFile, devices_under_test, serial, skip, temp_path};

/// One tensor of every dtype, with values that probe each dtype's range.
fn sample_tensors(device: &Device) -> Vec<(String, Tensor)> {
    let f16s: Vec<f16> = [0.5f32, -65504.0, 0.000_976_562_5, 1.0].map(f16::from_f32).to_vec();
    let bf16s: Vec<bf16> = [1.0f32, 2.0, -5.0, 3.0e38].map(bf16::from_f32).to_vec();
    vec![
        (
            "f32".into(),
            Tensor::from_slice(&[0.5f32, -1.25, 3.0e38, f32::MIN_POSITIVE, -0.0, 7.0], &[2, 3], device),
        ),
        (
            "f64".into(),
            Tensor::from_slice(&[1.0f64 / 3.0, -2.5e300, 0.0], &[3], device),
        ),
        ("f16".into(), Tensor::from_slice(&f16s, &[2, 2], device)),
        ("bf16".into(), Tensor::from_slice(&bf16s, &[4], device)),
        ("i32".into(), Tensor::from_slice(&[-7i32, i32::MAX, 0], &[3], device)),
        (
            "i64".into(),
            Tensor::from_slice(&[-9_007_199_254_740_993i64, 42], &[2], device),
        ),
        ("scalar".into(), Tensor::from_slice(&[42i64], &[], device)),
        ("u8".into(), Tensor::from_slice(&[0u8, 255, 7], &[3, 1], device)),
        (
            "bool".into(),
            Tensor::from_slice(&[true, false, true, true], &[4], device),
        ),
        ("empty".into(), Tensor::from_slice::<f32>(&[], &[0, 5], device)),
    ]
    .into_iter()
    .filter_map(|(name, t)| match t {
        Ok(t) => Some((name, t)),
        Err(e) => {
            skip(&format!("safetensors_io: `{name}` on {device}: {e}"));
            None
        }
    })
    .collect()
}

fn can_load(device: &Device, dtype: DType) -> bool {
    backend(device).unwrap().capabilities().supports(Op::Fill, dtype)
}

fn bytes_of(t: &Tensor) -> Vec<f64> {
    t.to_vec_f64().unwrap()
}

fn assert_same(expected: &Tensor, got: &Tensor, what: &str) {
    assert_eq!(got.dtype(), expected.dtype(), "{what}");
    assert_eq!(got.shape(), expected.shape(), "{what}");
    let (e, g) = (bytes_of(expected), bytes_of(got));
    let same = e.len() == g.len() && e.iter().zip(&g).all(|(a, b)| a.to_bits() == b.to_bits() || a == b);
    assert!(same, "{what}: {e:?} != {g:?}");
}

#[test]
fn every_dtype_round_trips_on_each_device_and_across() {
    let _guard = serial();
    for device in devices_under_test("safetensors_io/round_trip") {
        let tensors = sample_tensors(&device);
        let path = temp_path(&format!("round-{}.safetensors", device.kind().name()));
        let named: Vec<(&str, &Tensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
        save_safetensors(&path, &named).unwrap();
        for target in [device, Device::cpu()] {
            let loaded = load_safetensors(&path, &target).unwrap();
            assert_eq!(loaded.len(), tensors.len());
            for (name, original) in &tensors {
                if !can_load(&target, original.dtype()) {
                    continue;
                }
                let got = &loaded[name];
                assert_eq!(got.device(), target, "{name}");
                assert_same(original, got, &format!("{name}: {device} -> file -> {target}"));
            }
        }
    }
}

#[test]
fn strided_views_save_their_elements() {
    let _guard = serial();
    for device in devices_under_test("safetensors_io/strided") {
        let x = Tensor::arange(0.0, 12.0, 1.0, DType::F32, &device)
            .unwrap()
            .reshape(&[3, 4])
            .unwrap();
        let t = x.t().unwrap();
        assert!(!t.is_contiguous());
        let path = temp_path(&format!("strided-{}.safetensors", device.kind().name()));
        save_safetensors(&path, &[("t", &t)]).unwrap();
        let loaded = load_safetensors(&path, &device).unwrap();
        assert_eq!(loaded["t"].shape(), &[4, 3]);
        assert_eq!(loaded["t"].to_vec::<f32>().unwrap(), t.to_vec::<f32>().unwrap());
    }
}

#[test]
fn large_tensors_stream_in_chunks() {
    let _guard = serial();
    for device in devices_under_test("safetensors_io/large") {
        let n = (cartage::safetensors_io::STAGING_BYTES / 4) * 2 + 1234; // more than two chunks
        let big = Tensor::arange(0.0, n as f64, 1.0, DType::F32, &device).unwrap();
        let path = temp_path(&format!("large-{}.safetensors", device.kind().name()));
        save_safetensors(&path, &[("big", &big)]).unwrap();
        let loaded = load_safetensors(&path, &device).unwrap();
        let values = loaded["big"].to_vec::<f32>().unwrap();
        assert_eq!(values.len(), n);
        assert!(
            values.iter().enumerate().all(|(i, &v)| v == i as f32),
            "{device}: chunk seams corrupted"
        );
    }
}

#[test]
fn duplicate_names_are_refused() {
    let t = Tensor::zeros(&[2], DType::F32, &Device::cpu()).unwrap();
    let err = save_safetensors(temp_path("dup.safetensors"), &[("a", &t), ("a", &t)]).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
}

#[test]
fn the_metadata_name_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("reserved.safetensors");
    let t = Tensor::zeros(&[2], DType::F32, &Device::cpu()).unwrap();
    let err = save_safetensors(&path, &[("w", &t), ("__metadata__", &t)]).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    assert!(err.to_string().contains("reserves"), "{err}");
    assert!(!path.exists(), "nothing is written for a refused save");
}

/// The names in `dir`, sorted.
fn names_in(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn saving_replaces_the_file_only_once_complete() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let cpu = Device::cpu();
    let old = Tensor::from_slice(&[1.0f32, 2.0], &[2], &cpu).unwrap();
    save_safetensors(&path, &[("w", &old)]).unwrap();
    let old_bytes = std::fs::read(&path).unwrap();
    // A second name for the old file: writing in place would change what it reads too.
    let link = dir.path().join("old.safetensors");
    std::fs::hard_link(&path, &link).unwrap();

    let new = Tensor::from_slice(&[3.0f32, 4.0, 5.0], &[3], &cpu).unwrap();
    save_safetensors(&path, &[("w", &new)]).unwrap();
    assert_eq!(
        std::fs::read(&link).unwrap(),
        old_bytes,
        "the old file was overwritten in place"
    );
    assert_eq!(
        load_safetensors(&path, &cpu).unwrap()["w"].to_vec::<f32>().unwrap(),
        [3.0, 4.0, 5.0]
    );
    assert_eq!(
        names_in(dir.path()),
        ["model.safetensors", "old.safetensors"],
        "a temporary file was left"
    );

    // A save that fails at the end (a folder is in the way) leaves the folder as it was.
    let blocked = dir.path().join("blocked.safetensors");
    std::fs::create_dir(&blocked).unwrap();
    std::fs::write(blocked.join("keep"), b"x").unwrap();
    let err = save_safetensors(&blocked, &[("w", &new)]).unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err}");
    assert_eq!(names_in(&blocked), ["keep"]);
    assert_eq!(
        names_in(dir.path()),
        ["blocked.safetensors", "model.safetensors", "old.safetensors"],
        "a temporary file was left"
    );
}

#[cfg(unix)]
#[test]
fn a_replaced_file_keeps_its_permissions() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shared.safetensors");
    let t = Tensor::zeros(&[2], DType::F32, &Device::cpu()).unwrap();
    save_safetensors(&path, &[("w", &t)]).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
    save_safetensors(&path, &[("w", &t)]).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o640);
}

#[test]
fn metadata_round_trips_and_subsets_load_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.safetensors");
    let cpu = Device::cpu();
    let a = Tensor::from_slice(&[1.0f32, 2.0], &[2], &cpu).unwrap();
    let b = Tensor::from_slice(&[7i64, 8, 9], &[3], &cpu).unwrap();
    let c = Tensor::from_slice(&[true], &[1], &cpu).unwrap();
    let metadata = HashMap::from([
        ("format".to_string(), "pt".to_string()),
        ("step".to_string(), "1200".to_string()),
    ]);
    save_safetensors_with_metadata(&path, &[("a", &a), ("b", &b), ("c", &c)], &metadata).unwrap();

    let file = SafetensorsFile::open(&path).unwrap();
    assert_eq!(file.metadata(), &metadata);
    assert_eq!(file.len(), 3);
    assert_eq!(file.dtype_and_shape("b"), Some((DType::I64, [3usize].as_slice())));
    let mut names: Vec<&str> = file.names().collect();
    names.sort_unstable();
    assert_eq!(names, ["a", "b", "c"]);

    let some = file.load_only(&["c", "b", "c"], &cpu).unwrap();
    assert_eq!(some.len(), 2);
    assert_eq!(some["b"].to_vec::<i64>().unwrap(), [7, 8, 9]);
    assert_eq!(some["c"].to_vec::<bool>().unwrap(), [true]);
    assert!(file.load_only::<&str>(&[], &cpu).unwrap().is_empty());
    // Everything still loads, and a file without metadata has an empty map.
    assert_eq!(load_safetensors(&path, &cpu).unwrap().len(), 3);
    save_safetensors(&path, &[("a", &a)]).unwrap();
    assert!(SafetensorsFile::open(&path).unwrap().metadata().is_empty());
}

#[test]
fn an_unknown_name_lists_some_that_exist() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("many.safetensors");
    let cpu = Device::cpu();
    let t = Tensor::zeros(&[1], DType::F32, &cpu).unwrap();
    let names: Vec<String> = (0..8).map(|i| format!("layer{i}.weight")).collect();
    let named: Vec<(&str, &Tensor)> = names.iter().map(|n| (n.as_str(), &t)).collect();
    save_safetensors(&path, &named).unwrap();
    let err = SafetensorsFile::open(&path)
        .unwrap()
        .load_only(&["layer0.weight", "layer9.weight"], &cpu)
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains("`layer9.weight`"), "{text}");
    assert!(text.contains("`layer0.weight`") && text.contains("3 more"), "{text}");
    assert!(!text.contains("`layer7.weight`"), "lists only a few: {text}");
}

/// A file holding `json` as its header (padded to 8 bytes) and then `data`, in its own folder.
fn hostile(json: &str, data: &[u8]) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hostile.safetensors");
    let mut header = json.as_bytes().to_vec();
    header.resize(header.len().next_multiple_of(8), b' ');
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend(&header);
    bytes.extend(data);
    std::fs::write(&path, bytes).unwrap();
    (dir, path)
}

#[test]
fn hostile_headers_are_format_errors() {
    let cases = [
        (
            "elements overflow usize",
            r#"{"x":{"dtype":"U8","shape":[1099511627776,1099511627776],"data_offsets":[0,0]}}"#,
            vec![],
            "tensor `x`",
        ),
        (
            "bytes overflow usize",
            r#"{"x":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,0]}}"#,
            vec![],
            "tensor `x`",
        ),
        (
            "offsets disagree with the shape",
            r#"{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}"#,
            vec![0; 4],
            "takes 8",
        ),
        (
            "offsets past the end of the file",
            r#"{"x":{"dtype":"U8","shape":[576460752303423488],"data_offsets":[0,576460752303423488]}}"#,
            vec![0; 8],
            "reach past",
        ),
        (
            "offsets at u64::MAX",
            r#"{"x":{"dtype":"U8","shape":[0],"data_offsets":[18446744073709551615,18446744073709551615]}}"#,
            vec![0; 8],
            "reach past",
        ),
        (
            "offsets backwards",
            r#"{"x":{"dtype":"U8","shape":[4],"data_offsets":[8,4]}}"#,
            vec![0; 8],
            "end before",
        ),
        (
            "overlapping tensors",
            r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#,
            vec![0; 12],
            "overlap",
        ),
        (
            "a name twice",
            r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#,
            vec![0; 2],
            "twice",
        ),
        (
            "metadata that is not strings",
            r#"{"__metadata__":{"step":12},"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#,
            vec![0; 1],
            "`step`",
        ),
        (
            "a shape of floats",
            r#"{"x":{"dtype":"U8","shape":[1.5],"data_offsets":[0,1]}}"#,
            vec![0; 1],
            "`shape`",
        ),
    ];
    for (what, json, data, expected) in cases {
        let (_dir, path) = hostile(json, &data);
        let err = load_safetensors(&path, &Device::cpu()).unwrap_err();
        assert!(matches!(err, Error::Format { .. }), "{what}: {err}");
        assert!(err.to_string().contains(expected), "{what}: {err}");
        assert!(SafetensorsFile::open(&path).is_err(), "{what}");
        println!("{what}: {err}");
    }
}

#[test]
fn an_empty_tensor_with_huge_sizes_loads() {
    let (_dir, path) = hostile(
        r#"{"e":{"dtype":"F32","shape":[0,1099511627776,1099511627776],"data_offsets":[0,0]}}"#,
        &[],
    );
    let file = SafetensorsFile::open(&path).unwrap();
    assert_eq!(
        file.dtype_and_shape("e"),
        Some((DType::F32, [0, 1 << 40, 1 << 40].as_slice()))
    );
    let loaded = file.load(&Device::cpu()).unwrap();
    assert_eq!(loaded["e"].numel(), 0);
    assert_eq!(loaded["e"].shape(), &[0, 1 << 40, 1 << 40]);
}

#[test]
fn missing_file_is_an_io_error() {
    let err = load_safetensors("/no/such/dir/model.safetensors", &Device::cpu()).unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err}");
    assert!(err.to_string().contains("/no/such/dir/model.safetensors"), "{err}");
}

fn file_with_header(json: &str, data: &[u8]) -> TempFile {
    let mut header = json.as_bytes().to_vec();
    header.resize(header.len().next_multiple_of(8), b' ');
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend(&header);
    bytes.extend(data);
    let path = temp_path(&format!("crafted-{:x}.safetensors", bytes.len() * 31 + json.len()));
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn bad_files_are_format_errors() {
    let cases = [
        ("not json", file_with_header("{\"x\": ", &[0; 4])),
        (
            "truncated",
            file_with_header(r#"{"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#, &[0; 8]),
        ),
        (
            "bad offsets",
            file_with_header(r#"{"x":{"dtype":"F32","shape":[4],"data_offsets":[0,12]}}"#, &[0; 12]),
        ),
        (
            "foreign dtype",
            file_with_header(r#"{"x":{"dtype":"I8","shape":[2],"data_offsets":[0,2]}}"#, &[1, 2]),
        ),
    ];
    let tiny = temp_path("tiny.safetensors");
    std::fs::write(&tiny, [1u8, 2, 3]).unwrap();
    for (what, path) in cases.into_iter().chain([("shorter than the length prefix", tiny)]) {
        let err = load_safetensors(&path, &Device::cpu()).unwrap_err();
        assert!(matches!(err, Error::Format { .. }), "{what}: {err}");
        println!("{what}: {err}");
    }
    let foreign = file_with_header(r#"{"x":{"dtype":"I8","shape":[2],"data_offsets":[0,2]}}"#, &[1, 2]);
    assert!(
        load_safetensors(&foreign, &Device::cpu())
            .unwrap_err()
            .to_string()
            .contains("I8")
    );
}

const PYTHON: &str = r#"
import json, sys
import numpy as np
import safetensors
from safetensors.numpy import save_file
from safetensors import safe_open

mode, path = sys.argv[1], sys.argv[2]
if mode == "write":
    save_file({
        "f32": np.array([[0.5, -1.25, 3.0e38], [1.0e-3, -0.0, 7.0]], dtype=np.float32),
        "f64": np.array([1.0 / 3.0, -2.5e300], dtype=np.float64),
        "f16": np.array([0.5, -65504.0, 0.0009765625], dtype=np.float16),
        "i32": np.array([-7, 2147483647], dtype=np.int32),
        "i64": np.array([-9007199254740993, 42], dtype=np.int64),
        "scalar": np.array(42, dtype=np.int64),
        "u8": np.array([[0, 255, 7]], dtype=np.uint8),
        "bool": np.array([True, False, True], dtype=np.bool_),
    }, path)
    bits = np.array([0x3F80, 0x4000, 0xC0A0], dtype=np.uint16)  # bf16 1.0, 2.0, -5.0
    if hasattr(safetensors, "TensorSpec"):
        spec = safetensors.TensorSpec(dtype="bfloat16", shape=[3], data_ptr=bits.ctypes.data, data_len=bits.nbytes)
    else:
        spec = {"dtype": "BF16", "shape": [3], "data": bits.tobytes()}
    with open(path + ".bf16", "wb") as f:
        f.write(bytes(safetensors.serialize({"bf16": spec})))
else:
    out = {}
    with safe_open(path, framework="numpy") as f:
        for name in f.keys():
            if name != "bf16":
                t = f.get_tensor(name)
                out[name] = {"dtype": str(t.dtype), "shape": list(t.shape), "values": t.astype(np.float64).tolist()}
    for name, t in safetensors.deserialize(open(path, "rb").read()):
        if t["dtype"] == "BF16":
            bits = np.frombuffer(bytes(t["data"]), dtype=np.uint16)
            values = (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
            out[name] = {"dtype": "bfloat16", "shape": list(t["shape"]), "values": values.tolist()}
    print(json.dumps(out))
"#;

fn python() -> Option<&'static str> {
    let ok = std::process::Command::new("python3")
        .args(["-c", "import safetensors, numpy"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        skip(
            "safetensors_io/python: python3 with the `safetensors` and `numpy` packages is not installed (pip install safetensors numpy)",
        );
    }
    ok.then_some("python3")
}

fn run_python(mode: &str, path: &std::path::Path) -> String {
    let out = std::process::Command::new("python3")
        .args(["-c", PYTHON, mode, path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python {mode} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn flat(value: &serde_json::Value) -> Vec<f64> {
    match value {
        serde_json::Value::Array(items) => items.iter().flat_map(flat).collect(),
        serde_json::Value::Number(n) => vec![n.as_f64().unwrap()],
        serde_json::Value::Bool(b) => vec![f64::from(u8::from(*b))],
        other => panic!("unexpected {other}"),
    }
}

#[test]
fn files_from_python_load_and_ours_load_in_python() {
    let _guard = serial();
    if python().is_none() {
        return;
    }
    let from_python = temp_path("from-python.safetensors");
    run_python("write", &from_python);
    let bf16_path = TempFile(from_python.with_extension("safetensors.bf16"));
    let expected: HashMap<&str, (DType, Vec<usize>, Vec<f64>)> = HashMap::from([
        (
            "f32",
            (
                DType::F32,
                vec![2, 3],
                [0.5f32, -1.25, 3.0e38, 1.0e-3, -0.0, 7.0].map(f64::from).to_vec(),
            ),
        ),
        ("f64", (DType::F64, vec![2], vec![1.0 / 3.0, -2.5e300])),
        ("f16", (DType::F16, vec![3], vec![0.5, -65504.0, 0.000_976_562_5])),
        ("i32", (DType::I32, vec![2], vec![-7.0, 2_147_483_647.0])),
        (
            "i64",
            (DType::I64, vec![2], vec![-9_007_199_254_740_993i64 as f64, 42.0]),
        ),
        ("scalar", (DType::I64, vec![], vec![42.0])),
        ("u8", (DType::U8, vec![1, 3], vec![0.0, 255.0, 7.0])),
        ("bool", (DType::Bool, vec![3], vec![1.0, 0.0, 1.0])),
        ("bf16", (DType::BF16, vec![3], vec![1.0, 2.0, -5.0])),
    ]);
    for device in devices_under_test("safetensors_io/python") {
        let mut loaded = load_safetensors(&from_python, &device).unwrap();
        loaded.extend(load_safetensors(&bf16_path, &device).unwrap());
        assert_eq!(loaded.len(), expected.len());
        for (name, (dtype, shape, values)) in &expected {
            let t = &loaded[*name];
            assert_eq!(
                (t.dtype(), t.shape(), t.device()),
                (*dtype, shape.as_slice(), device),
                "{name}"
            );
            if can_load(&device, *dtype) {
                assert_eq!(&t.to_vec_f64().unwrap(), values, "{name} on {device}");
            }
        }
        // i64 beyond 2^53 must survive exactly.
        if can_load(&device, DType::I64) {
            assert_eq!(loaded["i64"].to_vec::<i64>().unwrap()[0], -9_007_199_254_740_993);
        }

        let ours = sample_tensors(&device);
        let to_python = temp_path(&format!("to-python-{}.safetensors", device.kind().name()));
        let named: Vec<(&str, &Tensor)> = ours.iter().map(|(n, t)| (n.as_str(), t)).collect();
        save_safetensors(&to_python, &named).unwrap();
        let seen: serde_json::Value = serde_json::from_str(&run_python("read", &to_python)).unwrap();
        for (name, tensor) in &ours {
            let entry = &seen[name.as_str()];
            assert!(!entry.is_null(), "python did not see `{name}`: {seen}");
            let shape: Vec<usize> = flat(&entry["shape"]).into_iter().map(|d| d as usize).collect();
            assert_eq!(shape, tensor.shape(), "{name}");
            let python_values = flat(&entry["values"]);
            let ours = tensor.to_vec_f64().unwrap();
            // JSON numbers pass through decimal text: allow the last bit of an f64 to differ.
            assert_eq!(python_values.len(), ours.len(), "{name}");
            for (p, o) in python_values.iter().zip(&ours) {
                assert!(
                    p == o || (p - o).abs() <= 1e-15 * o.abs(),
                    "{name}: python {p} vs ours {o}"
                );
            }
        }
    }
}
