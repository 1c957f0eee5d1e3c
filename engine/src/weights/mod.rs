pub mod linear;
pub mod store;
