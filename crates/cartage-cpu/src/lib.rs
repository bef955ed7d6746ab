//! The cpu backend of cartage.
