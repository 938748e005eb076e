purge(0)
return total(0)
