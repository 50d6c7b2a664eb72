module watchproxy.bench/gosub

go 1.25.0
