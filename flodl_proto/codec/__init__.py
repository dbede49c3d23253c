"""Pure codec: bytes <-> records. No sockets, no threads, no clocks."""
