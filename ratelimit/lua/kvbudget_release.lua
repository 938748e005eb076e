drop(0, ARGV[1])
purge(0)
return 1
