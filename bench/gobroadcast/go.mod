module watchproxy.bench/gobroadcast

go 1.25.0
