//! Neural-network primitives: normalisation, losses, dropout, convolution, pooling, attention.
