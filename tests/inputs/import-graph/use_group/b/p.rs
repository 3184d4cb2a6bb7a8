use super::{
    q::{self, Q},
    r,
};

pub fn f() -> Q {
    r::g();
    q::make()
}
