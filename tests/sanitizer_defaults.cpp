// sanitizer_defaults.cpp — runtime defaults of the sanitizer builds (-DKVSCOPE_SANITIZE=...),
// compiled into every target so that ctest, a test run by hand and `kvscope` itself behave
// the same. Options from the environment (ASAN_OPTIONS, ...) still override these.
//
// The only suppression is for leaks inside the OpenGL driver: Mesa's GLX and DRI/Gallium
// libraries (and the LLVM JIT that llvmpipe uses) keep allocations for the lifetime of the
// process that they never free, even after glfwTerminate, in the tests that open a GL
// context (render, capture). A suppression matches when any frame of the leak's allocation
// stack lies in the named library, so it cannot hide a leak whose allocation happened in
// kvscope's own code unless that code called into the driver to allocate. Nothing else is
// suppressed.
//
// For a library name to match, the library must still be mapped when LeakSanitizer runs
// at exit; GLFW unloads the driver in glfwTerminate, which leaves '<unknown module>' frames
// that no suppression can name. So sanitizer builds make dlclose() keep every library
// loaded until the process exits (it is called only at shutdown in kvscope and its tests).
// With the driver kept loaded, its blocks stay reachable from its globals: on Debian 12's
// Mesa (llvmpipe, GLX under Xvfb and EGL surfaceless) the render and capture tests report
// no leak and match none of the suppressions below; they stay for drivers that do drop
// their pointers.

extern "C" {

// detect_leaks: on by default on Linux; stated so a plain ASan run checks leaks too.
// check_initialization_order + strict_init_order: static-initialisation-order bugs.
__attribute__((used, visibility("default"))) const char* __asan_default_options() {
  return "detect_leaks=1:check_initialization_order=1:strict_init_order=1";
}

// A UBSan finding prints its stack (the build also aborts on the first finding).
__attribute__((used, visibility("default"))) const char* __ubsan_default_options() {
  return "print_stacktrace=1:halt_on_error=1";
}

__attribute__((used, visibility("default"))) const char* __lsan_default_suppressions() {
  return "leak:libGLX_mesa.so\n"
         "leak:libgallium\n"
         "leak:swrast_dri.so\n"
         "leak:kms_swrast_dri.so\n"
         "leak:libLLVM\n";
}

// Interposes libc's dlclose for every caller in the process (the executable's symbol comes
// first): the library stays loaded, the call succeeds.
__attribute__((used, visibility("default"))) int dlclose(void*) noexcept {
  return 0;
}

}  // extern "C"
