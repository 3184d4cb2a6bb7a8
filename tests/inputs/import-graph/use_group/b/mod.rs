pub mod p;
pub mod q;
pub mod r;
