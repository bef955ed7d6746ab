//! The on-disk cache of compiled kernel images: a checked entry format in a private folder.
//!
//! An entry is a fixed header, then the image:
//!
//! | bytes | field                                                        |
//! |-------|--------------------------------------------------------------|
//! | 8     | magic, `CARTKRN` and a NUL                                   |
//! | 4     | format version, little-endian ([`FORMAT_VERSION`])           |
//! | 32    | SHA-256 of the cache key                                     |
//! | 8     | image length in bytes, little-endian                         |
//! | 32    | SHA-256 over the header fields above, the key and the image  |
//! | n     | the image                                                    |
//!
//! The key holds everything the image depends on (the source, the architecture, the image kind,
//! NVRTC's options and version, the format version). Reading checks the length, magic, version,
//! key, declared length and digest before anything reaches the driver; any failure is a miss,
//! logged with `tracing::warn!`, and the caller recompiles and overwrites the entry.
//!
//! The digest catches corruption, not an attacker (anyone can compute a SHA-256), so on Unix the
//! folder is trusted only when it is a real directory (not a symbolic link) owned by the current
//! user and writable by no one else; it is created with mode 0700. Otherwise the disk cache is
//! off for the process, with a warning, and kernels are compiled on every run. Each entry is also
//! opened without following symbolic links and must be a regular file owned by the current user
//! and writable by no one else. Writes go to a fresh temporary file in the same folder, created
//! with `create_new` (which never opens an existing path or follows a link) and mode 0600, then
//! renamed over the entry, so a reader never sees half an entry.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};

/// The first bytes of every entry.
pub(crate) const MAGIC: [u8; 8] = *b"CARTKRN\0";

/// The entry format; bumped when the layout of an entry or the key changes.
pub(crate) const FORMAT_VERSION: u32 = 2;

/// Bytes before the image: magic, version, key digest, length, entry digest.
pub(crate) const HEADER_BYTES: usize = 8 + 4 + 32 + 8 + 32;

/// The largest entry read back (far above any kernel module; a larger file is not ours).
const MAX_ENTRY_BYTES: u64 = 256 << 20;

/// Everything a compiled image depends on, as labelled parts, and its SHA-256.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CacheKey {
    canonical: Vec<u8>,
    digest: [u8; 32],
}

impl CacheKey {
    /// A key from `(label, value)` parts. Each part is length-prefixed, so no two different lists
    /// of parts encode alike.
    pub(crate) fn new(parts: &[(&str, &[u8])]) -> Self {
        let mut canonical = b"cartage kernel cache key\0".to_vec();
        canonical.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        for (label, value) in parts {
            for field in [label.as_bytes(), value] {
                canonical.extend_from_slice(&(field.len() as u64).to_le_bytes());
                canonical.extend_from_slice(field);
            }
        }
        let digest = sha256(&[&canonical]);
        CacheKey { canonical, digest }
    }

    /// A short hexadecimal name for file names (the first 8 bytes of the digest).
    pub(crate) fn short_hex(&self) -> String {
        self.digest[..8].iter().map(|b| format!("{b:02x}")).collect()
    }
}

fn sha256(parts: &[&[u8]]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part);
    }
    hasher.finalize().into()
}

/// The digest stored in an entry: over the fixed fields, the whole key and the image.
fn entry_digest(key: &CacheKey, len: u64, image: &[u8]) -> [u8; 32] {
    sha256(&[
        &MAGIC,
        &FORMAT_VERSION.to_le_bytes(),
        &key.canonical,
        &len.to_le_bytes(),
        image,
    ])
}

/// Why a cache entry was not used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum EntryError {
    /// Shorter than the header.
    #[error("the entry holds {len} bytes, fewer than the {HEADER_BYTES}-byte header (truncated?)")]
    Short {
        /// The entry's length.
        len: usize,
    },
    /// Not a cartage kernel cache entry.
    #[error("the entry does not start with the cache's magic bytes (not written by cartage)")]
    Magic,
    /// Written by another version of the format.
    #[error("the entry has format version {found}, this build reads {FORMAT_VERSION}")]
    Version {
        /// The version found.
        found: u32,
    },
    /// Compiled from another source, architecture, options or NVRTC.
    #[error("the entry was compiled for another key (source, architecture, options or NVRTC version)")]
    Key,
    /// The declared image length is not what follows the header.
    #[error("the entry declares {declared} image bytes but holds {actual} (truncated or appended to?)")]
    Length {
        /// The length in the header.
        declared: u64,
        /// The bytes after the header.
        actual: u64,
    },
    /// The digest does not match the key and image.
    #[error("the entry's SHA-256 does not match its contents (corrupted)")]
    Digest,
    /// The image is empty.
    #[error("the entry holds an empty image")]
    Empty,
}

/// An entry for `image` compiled under `key`.
pub(crate) fn encode(key: &CacheKey, image: &[u8]) -> Vec<u8> {
    let len = image.len() as u64;
    let mut out = Vec::with_capacity(HEADER_BYTES + image.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&key.digest);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&entry_digest(key, len, image));
    out.extend_from_slice(image);
    out
}

/// The image in `entry` if every field checks out for `key`.
pub(crate) fn decode<'a>(entry: &'a [u8], key: &CacheKey) -> Result<&'a [u8], EntryError> {
    if entry.len() < HEADER_BYTES {
        return Err(EntryError::Short { len: entry.len() });
    }
    let (header, image) = entry.split_at(HEADER_BYTES);
    let (magic, rest) = header.split_at(8);
    let (version, rest) = rest.split_at(4);
    let (key_digest, rest) = rest.split_at(32);
    let (len, digest) = rest.split_at(8);
    if magic != MAGIC {
        return Err(EntryError::Magic);
    }
    let found = u32::from_le_bytes(version.try_into().map_err(|_| EntryError::Magic)?);
    if found != FORMAT_VERSION {
        return Err(EntryError::Version { found });
    }
    if key_digest != key.digest {
        return Err(EntryError::Key);
    }
    let declared = u64::from_le_bytes(len.try_into().map_err(|_| EntryError::Magic)?);
    if declared != image.len() as u64 {
        return Err(EntryError::Length {
            declared,
            actual: image.len() as u64,
        });
    }
    if digest != entry_digest(key, declared, image) {
        return Err(EntryError::Digest);
    }
    if image.is_empty() {
        return Err(EntryError::Empty);
    }
    Ok(image)
}

/// The cache folder, checked to be private to this user.
#[derive(Debug)]
pub(crate) struct DiskCache {
    dir: PathBuf,
}

impl DiskCache {
    /// The cache in `dir`, created (mode 0700) when missing; `None`, with a warning, when the
    /// folder cannot be created or is not private to this user.
    pub(crate) fn open(dir: PathBuf) -> Option<DiskCache> {
        match prepare_dir(&dir) {
            Ok(()) => Some(DiskCache { dir }),
            Err(reason) => {
                tracing::warn!(
                    dir = %dir.display(),
                    "the kernel disk cache is off: {reason}; kernels are compiled on every run. Use a folder \
                     that only you own and can write (`chmod 700` it, or point XDG_CACHE_HOME elsewhere)"
                );
                None
            }
        }
    }

    /// The folder.
    #[cfg(test)]
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the entry `file_name` lives.
    pub(crate) fn path(&self, file_name: &str) -> PathBuf {
        self.dir.join(file_name)
    }

    /// The image stored as `file_name` under `key`, or `None`: a missing entry quietly, any other
    /// failure with a warning (the caller then recompiles and overwrites it).
    pub(crate) fn read(&self, file_name: &str, key: &CacheKey) -> Option<Vec<u8>> {
        let path = self.path(file_name);
        match read_entry(&path) {
            Ok(bytes) => match decode(&bytes, key) {
                Ok(image) => Some(image.to_vec()),
                Err(e) => {
                    tracing::warn!(path = %path.display(), "ignoring the cached kernel image: {e}; recompiling");
                    None
                }
            },
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => {
                tracing::warn!(path = %path.display(), "ignoring the cached kernel image: {e}; recompiling");
                None
            }
        }
    }

    /// Store `image` as `file_name` under `key`: through a new private temporary file in the
    /// folder and a rename. The temporary file is removed on every failure.
    pub(crate) fn write(&self, file_name: &str, key: &CacheKey, image: &[u8]) -> io::Result<()> {
        let entry = encode(key, image);
        let (tmp_path, mut file) = create_temp(&self.dir, file_name)?;
        let written = file.write_all(&entry);
        drop(file);
        written
            .and_then(|()| fs::rename(&tmp_path, self.path(file_name)))
            .inspect_err(|_| {
                let _ = fs::remove_file(&tmp_path);
            })
    }
}

/// Open `path` for reading without following a final symbolic link, check that it is a regular
/// file that only this user owns and can write, and read it whole (bounded).
fn read_entry(path: &Path) -> io::Result<Vec<u8>> {
    let mut options = OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NOFOLLOW);
    }
    let file = options.open(path).map_err(name_link_errors)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the entry is not a regular file",
        ));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        check_private(meta.uid(), meta.mode(), current_uid())
            .map_err(|reason| io::Error::new(io::ErrorKind::PermissionDenied, format!("the entry {reason}")))?;
    }
    if meta.len() > MAX_ENTRY_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the entry holds {} bytes, more than any kernel image", meta.len()),
        ));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(MAX_ENTRY_BYTES + 1).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Says "a symbolic link" for the error `O_NOFOLLOW` gives on one.
fn name_link_errors(e: io::Error) -> io::Error {
    #[cfg(unix)]
    if e.raw_os_error() == Some(libc::ELOOP) {
        return io::Error::new(io::ErrorKind::InvalidData, "the entry is a symbolic link");
    }
    e
}

/// Create a new temporary file next to the entry `file_name` in `dir`: `create_new` (so an
/// existing file or link at that name is never opened) and, on Unix, mode 0600.
fn create_temp(dir: &Path, file_name: &str) -> io::Result<(PathBuf, File)> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let mut last = None;
    for _ in 0..16 {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!(".{file_name}.{}.{nanos:08x}.{n}.tmp", std::process::id()));
        let mut options = OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            options.mode(0o600);
        }
        match options.open(&path) {
            Ok(file) => return Ok((path, file)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("no free temporary file name")))
}

/// The effective user id, the identity the kernel gives the files this process creates and
/// checks permissions against. Read with `geteuid` rather than inferred from the owner of a probe
/// file: that needs no writable place and cannot fail, and `libc` is already in the dependency
/// graph, so it costs no new crate.
#[cfg(unix)]
fn current_uid() -> u32 {
    // SAFETY: `geteuid` takes no arguments, touches no memory of ours and always succeeds.
    unsafe { libc::geteuid() }
}

/// `Ok` when a file or folder with owner `uid` and `mode` is private to user `me`: owned by them
/// and writable by neither group nor others; else the reason.
#[cfg(unix)]
fn check_private(uid: u32, mode: u32, me: u32) -> Result<(), String> {
    if uid != me {
        return Err(format!("is owned by user {uid}, not by this user ({me})"));
    }
    if mode & 0o022 != 0 {
        return Err(format!("is writable by group or others (mode {:o})", mode & 0o7777));
    }
    Ok(())
}

/// Create `dir` (mode 0700, parents included) when missing, then check that it is a real
/// directory private to this user.
#[cfg(unix)]
fn prepare_dir(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let describe = |e: io::Error| format!("{} cannot be created or read ({e})", dir.display());
    if let Err(e) = fs::symlink_metadata(dir) {
        if e.kind() != io::ErrorKind::NotFound {
            return Err(describe(e));
        }
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(describe)?;
    }
    let meta = fs::symlink_metadata(dir).map_err(describe)?;
    if meta.file_type().is_symlink() {
        return Err(format!("{} is a symbolic link", dir.display()));
    }
    if !meta.is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    check_private(meta.uid(), meta.mode(), current_uid()).map_err(|reason| format!("{} {reason}", dir.display()))
}

/// Create `dir` when missing. Without Unix ownership and modes there is nothing more to check.
#[cfg(not(unix))]
fn prepare_dir(dir: &Path) -> Result<(), String> {
    fs::create_dir_all(dir).map_err(|e| format!("{} cannot be created ({e})", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(source: &str) -> CacheKey {
        CacheKey::new(&[("source", source.as_bytes()), ("arch", b"sm_90"), ("kind", b"cubin")])
    }

    fn image() -> Vec<u8> {
        (0..300u32).map(|i| (i * 7 % 251) as u8).collect()
    }

    /// A cache in a fresh private folder inside a temporary directory.
    fn cache() -> (tempfile::TempDir, DiskCache) {
        let root = tempfile::tempdir().unwrap();
        let cache = DiskCache::open(root.path().join("cartage").join("kernels")).expect("a private folder");
        (root, cache)
    }

    fn names_in(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn an_entry_round_trips() {
        let (k, img) = (key("a"), image());
        let entry = encode(&k, &img);
        assert_eq!(entry.len(), HEADER_BYTES + img.len());
        assert_eq!(&entry[..8], &MAGIC);
        assert_eq!(decode(&entry, &k), Ok(img.as_slice()));
    }

    #[test]
    fn keys_follow_every_part() {
        let a = key("source");
        assert_eq!(a, key("source"));
        assert_ne!(a, key("sourc"));
        assert_ne!(
            CacheKey::new(&[("a", b"xy"), ("b", b"z")]),
            CacheKey::new(&[("a", b"x"), ("b", b"yz")]),
            "parts are length-prefixed"
        );
        assert_eq!(a.short_hex().len(), 16);
    }

    #[test]
    fn truncated_and_empty_entries_are_rejected() {
        let (k, img) = (key("a"), image());
        let entry = encode(&k, &img);
        assert_eq!(decode(&[], &k), Err(EntryError::Short { len: 0 }));
        for len in [1, 8, HEADER_BYTES - 1] {
            assert_eq!(decode(&entry[..len], &k), Err(EntryError::Short { len }));
        }
        for len in [HEADER_BYTES, HEADER_BYTES + 1, entry.len() - 1] {
            assert!(
                matches!(decode(&entry[..len], &k), Err(EntryError::Length { .. })),
                "{len} bytes"
            );
        }
        let mut appended = entry.clone();
        appended.push(0);
        assert!(matches!(decode(&appended, &k), Err(EntryError::Length { .. })));
        assert_eq!(decode(&encode(&k, &[]), &k), Err(EntryError::Empty));
    }

    #[test]
    fn every_flipped_bit_is_caught() {
        let k = key("a");
        let entry = encode(&k, b"tiny image");
        for at in 0..entry.len() {
            for bit in 0..8 {
                let mut bad = entry.clone();
                bad[at] ^= 1 << bit;
                assert!(decode(&bad, &k).is_err(), "byte {at} bit {bit} went unnoticed");
            }
        }
    }

    #[test]
    fn an_entry_for_another_key_is_rejected() {
        let entry = encode(&key("a"), &image());
        assert_eq!(decode(&entry, &key("b")), Err(EntryError::Key));
        // The same entry with the key digest rewritten: the entry digest covers the whole key.
        let mut forged = entry.clone();
        forged[12..44].copy_from_slice(&key("b").digest);
        assert_eq!(decode(&forged, &key("b")), Err(EntryError::Digest));
    }

    #[test]
    fn foreign_files_are_rejected() {
        let k = key("a");
        let mut raw_cubin = b"\x7fELF\x02\x01".to_vec();
        raw_cubin.resize(4096, 0);
        assert_eq!(decode(&raw_cubin, &k), Err(EntryError::Magic));
        let ptx = b"//\n.version 8.0\n.target sm_90\n.address_size 64\n.visible .entry evil() { ret; }\n".repeat(2);
        assert_eq!(decode(&ptx, &k), Err(EntryError::Magic));
        let mut old = encode(&k, &image());
        old[8..12].copy_from_slice(&1u32.to_le_bytes());
        assert_eq!(decode(&old, &k), Err(EntryError::Version { found: 1 }));
    }

    #[test]
    fn the_cache_reads_back_what_it_wrote_and_leaves_no_temporary_file() {
        let (_root, cache) = cache();
        let k = key("a");
        assert_eq!(cache.read("unary.cubin", &k), None, "a missing entry is a miss");
        cache.write("unary.cubin", &k, &image()).unwrap();
        assert_eq!(cache.read("unary.cubin", &k), Some(image()));
        assert_eq!(cache.read("unary.cubin", &key("b")), None);
        // Overwriting replaces the entry in place.
        cache.write("unary.cubin", &k, b"newer").unwrap();
        assert_eq!(cache.read("unary.cubin", &k), Some(b"newer".to_vec()));
        assert_eq!(names_in(cache.dir()), ["unary.cubin"]);
    }

    #[test]
    fn a_failed_write_leaves_no_temporary_file() {
        let (_root, cache) = cache();
        // A directory where the entry should go: the rename fails.
        fs::create_dir(cache.path("unary.cubin")).unwrap();
        assert!(cache.write("unary.cubin", &key("a"), &image()).is_err());
        assert_eq!(names_in(cache.dir()), ["unary.cubin"]);
    }

    #[test]
    fn planted_and_damaged_files_are_misses_and_get_overwritten() {
        let (_root, cache) = cache();
        let k = key("a");
        let path = cache.path("unary.cubin");
        for planted in [Vec::new(), b"\x7fELF".to_vec(), encode(&key("other"), &image())] {
            fs::write(&path, &planted).unwrap();
            assert_eq!(cache.read("unary.cubin", &k), None);
        }
        cache.write("unary.cubin", &k, &image()).unwrap();
        assert_eq!(cache.read("unary.cubin", &k), Some(image()));
    }

    #[cfg(unix)]
    #[test]
    fn entries_are_private_and_links_are_not_followed() {
        use std::os::unix::fs::{PermissionsExt, symlink};
        let (root, cache) = cache();
        let k = key("a");
        // A link at the entry's name is neither read nor written through.
        let outside = root.path().join("outside");
        fs::write(&outside, encode(&k, &image())).unwrap();
        let path = cache.path("unary.cubin");
        symlink(&outside, &path).unwrap();
        assert_eq!(cache.read("unary.cubin", &k), None, "read through a link");
        cache.write("unary.cubin", &k, b"mine").unwrap();
        assert!(!fs::symlink_metadata(&path).unwrap().file_type().is_symlink());
        assert_eq!(
            fs::read(&outside).unwrap(),
            encode(&k, &image()),
            "wrote through a link"
        );
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        // An entry others can write is not trusted.
        fs::set_permissions(&path, fs::Permissions::from_mode(0o666)).unwrap();
        assert_eq!(cache.read("unary.cubin", &k), None);
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(cache.read("unary.cubin", &k), Some(b"mine".to_vec()));
    }

    #[cfg(unix)]
    #[test]
    fn the_folder_is_created_private() {
        use std::os::unix::fs::PermissionsExt;
        let (root, cache) = cache();
        for dir in [cache.dir(), &root.path().join("cartage")] {
            assert_eq!(
                fs::metadata(dir).unwrap().permissions().mode() & 0o777,
                0o700,
                "{}",
                dir.display()
            );
        }
    }

    #[cfg(unix)]
    #[test]
    fn a_linked_or_shared_folder_turns_the_cache_off() {
        use std::os::unix::fs::{PermissionsExt, symlink};
        let root = tempfile::tempdir().unwrap();
        let real = root.path().join("real");
        fs::create_dir(&real).unwrap();
        fs::set_permissions(&real, fs::Permissions::from_mode(0o700)).unwrap();
        assert!(DiskCache::open(real.clone()).is_some());
        let link = root.path().join("link");
        symlink(&real, &link).unwrap();
        assert!(DiskCache::open(link).is_none(), "a symbolic link");
        for mode in [0o777, 0o770, 0o702] {
            fs::set_permissions(&real, fs::Permissions::from_mode(mode)).unwrap();
            assert!(DiskCache::open(real.clone()).is_none(), "mode {mode:o}");
        }
        let file = root.path().join("file");
        fs::write(&file, b"").unwrap();
        assert!(DiskCache::open(file).is_none(), "a regular file");
    }

    #[cfg(unix)]
    #[test]
    fn ownership_is_checked() {
        let me = current_uid();
        assert_eq!(check_private(me, 0o40700, me), Ok(()));
        assert_eq!(check_private(me, 0o40755, me), Ok(()));
        assert!(
            check_private(me + 1, 0o40700, me)
                .unwrap_err()
                .contains("owned by user")
        );
        assert!(check_private(me, 0o40720, me).unwrap_err().contains("writable"));
        assert!(check_private(me, 0o100602, me).is_err());
    }

    /// As root, a folder and an entry owned by another user are refused for real.
    #[cfg(unix)]
    #[test]
    fn another_users_folder_and_entries_are_refused() {
        use std::os::unix::fs::{PermissionsExt, chown};
        if current_uid() != 0 {
            eprintln!("SKIP another_users_folder_and_entries_are_refused: needs root to chown");
            return;
        }
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("kernels");
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
        let cache = DiskCache::open(dir.clone()).expect("own folder");
        let k = key("a");
        cache.write("unary.cubin", &k, &image()).unwrap();
        assert!(cache.read("unary.cubin", &k).is_some());
        chown(cache.path("unary.cubin"), Some(65534), None).unwrap();
        assert_eq!(cache.read("unary.cubin", &k), None, "an entry planted by another user");
        chown(&dir, Some(65534), None).unwrap();
        assert!(DiskCache::open(dir).is_none(), "another user's folder");
    }
}
