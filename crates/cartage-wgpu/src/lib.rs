//! The wgpu backend of cartage.
