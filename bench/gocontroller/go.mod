module watchproxy.bench/gocontroller

go 1.25.0
