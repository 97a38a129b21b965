# Every ```cpp block of docs/ compiled: see below.
