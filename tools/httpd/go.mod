module vmtax.local/httpd

go 1.19
