// A shared object that exports nothing the HTTPS module loader looks for.
extern "C" int not_a_module() { return 1; }
