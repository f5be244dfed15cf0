//! HBM pool: placeholder, being written.
