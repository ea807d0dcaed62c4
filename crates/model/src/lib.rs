//! Pure saga state model.
