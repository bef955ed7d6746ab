//! The cuda backend of cartage.
