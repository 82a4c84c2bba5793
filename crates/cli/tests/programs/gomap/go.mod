module gomap

go 1.21
