"""flodl-proto: byte-exact implementation of flodl's cluster data-channel protocol."""
