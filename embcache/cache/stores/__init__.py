"""Where every row lives when it is not in the working set: the host store, its files, the link to the device and the rows moved over it."""
