module compatfs/tests/gotmpl

go 1.19
