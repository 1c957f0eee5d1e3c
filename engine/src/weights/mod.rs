pub mod linear;
pub mod store;
pub mod pages;
