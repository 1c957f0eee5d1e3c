pub mod linear;
pub mod pages;
pub mod store;
