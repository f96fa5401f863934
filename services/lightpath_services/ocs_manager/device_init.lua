-- KEYS: the device table hashes (d * K + k), then the device 1xK hashes (d).
-- ARGV: fabric header (7).
set_fabric({unpack(ARGV, 1, 7)})
init_layout(1, 1 + M * K)
return 1
