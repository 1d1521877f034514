module vmtax.local/vsock

go 1.19
