# `cmake --install` rules and the Debian packages (CPack DEB). Included by the
# top-level CMakeLists.txt after every subdirectory, so the targets exist.
# scripts/package builds the packages; tests/packaging checks them.
#
# Two components, one Debian package each:
#   runtime -> conveyor       the daemons, conveyorctl, systemd units, default
#                             configuration, dashboards, shell completion
#   cuda    -> conveyor-cuda  libconveyor_cuda.so, the worker's CUDA plugin,
#                             where the CUDA parts are built
# The plugin needs cuBLAS and NCCL, which come from NVIDIA's repositories, not
# Debian's: keeping it apart leaves `conveyor` installable on any Debian 12
# machine, GPU or not (a worker without the plugin runs cpu:N devices).
#
# Paths (with the default prefix /usr, which the systemd units assume):
#   /usr/bin/conveyor-coordinator, conveyor-worker, conveyorctl
#   /usr/lib/<multiarch>/conveyor/libconveyor_cuda.so
#   /usr/lib/systemd/system/conveyor-coordinator.service, conveyor-worker@.service
#   /usr/lib/sysusers.d/conveyor.conf
#   /etc/conveyor/coordinator.env, worker.env, coordinator.yaml (conffiles)
#   /usr/share/conveyor/grafana/, /usr/share/conveyor/prometheus/
#   /usr/share/bash-completion/completions/conveyorctl
#   /usr/share/zsh/vendor-completions/_conveyorctl
#   /usr/share/doc/conveyor{,-cuda}/copyright, changelog.Debian.gz

include(GNUInstallDirs)

# Install rules without a COMPONENT (a future install() in a subdirectory)
# land in the main package rather than in a package of their own.
set(CMAKE_INSTALL_DEFAULT_COMPONENT_NAME runtime)
# Directories that install() creates are 0755 whatever the umask: Debian
# expects that (lintian: non-standard-dir-perm).
set(CMAKE_INSTALL_DEFAULT_DIRECTORY_PERMISSIONS
    OWNER_READ OWNER_WRITE OWNER_EXECUTE
    GROUP_READ GROUP_EXECUTE
    WORLD_READ WORLD_EXECUTE)

set(_conveyor_deploy ${PROJECT_SOURCE_DIR}/deploy)
set(_conveyor_packaging ${PROJECT_BINARY_DIR}/packaging)
# The package revision: the Debian version is <project version>-<revision>.
set(CONVEYOR_DEB_REVISION 1 CACHE STRING
    "Debian revision of the conveyor packages (version ${PROJECT_VERSION}-REVISION)")
set(CONVEYOR_PACKAGE_MAINTAINER
    "Conveyor maintainers <maintainers@users.noreply.a-seed-f096077a.example>"
    CACHE STRING "Maintainer field of the Debian packages")

# --- Binaries --------------------------------------------------------------

install(TARGETS conveyor-coordinator conveyor-worker conveyorctl
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)

if(TARGET conveyor_cuda_plugin)
  # A private plugin that only conveyor-worker dlopens by path, so it goes
  # in a directory of its own rather than on the loader's search path.
  set(_conveyor_plugin_dir ${CMAKE_INSTALL_LIBDIR}/conveyor)
  install(TARGETS conveyor_cuda_plugin
          LIBRARY DESTINATION ${_conveyor_plugin_dir} COMPONENT cuda
          PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
  # The worker finds it relative to its own executable (bin/../lib/...), so
  # an install under any prefix, or a package extracted into a staging
  # directory, loads its own plugin (worker/device_backends.cc).
  file(RELATIVE_PATH _conveyor_plugin_reldir
       ${CMAKE_INSTALL_FULL_BINDIR} ${CMAKE_INSTALL_FULL_LIBDIR}/conveyor)
  target_compile_definitions(conveyor_device_backends PRIVATE
    CONVEYOR_CUDA_PLUGIN_INSTALL_RELDIR="${_conveyor_plugin_reldir}")
endif()

# --- systemd ---------------------------------------------------------------

# Prefix-relative: systemd reads units and sysusers.d entries from both
# /usr/lib and /usr/local/lib.
install(FILES ${_conveyor_deploy}/systemd/conveyor-coordinator.service
              ${_conveyor_deploy}/systemd/conveyor-worker@.service
        DESTINATION lib/systemd/system COMPONENT runtime)
install(FILES ${_conveyor_deploy}/systemd/sysusers.d/conveyor.conf
        DESTINATION lib/sysusers.d COMPONENT runtime)
# The configuration goes where GNUInstallDirs puts a prefix's sysconfdir,
# decided when installing (cmake --install --prefix P may differ from the
# configured prefix): /etc/conveyor for the prefix /usr (the package, and
# `sudo cmake --install build` with the default prefix), which the units
# read; P/etc/conveyor for any other prefix P, so an install under a prefix
# never writes outside it (it once wrote /etc whatever the prefix). In the
# package these are conffiles (deploy/debian/conffiles), so an upgrade keeps
# the operator's edits. file(INSTALL) honours DESTDIR, as CPack uses it.
install(CODE "
  if(CMAKE_INSTALL_PREFIX STREQUAL \"/usr\" OR CMAKE_INSTALL_PREFIX STREQUAL \"/\")
    set(_conveyor_etc \"/etc/conveyor\")
  else()
    set(_conveyor_etc \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_SYSCONFDIR}/conveyor\")
  endif()
  file(INSTALL DESTINATION \"\${_conveyor_etc}\" TYPE FILE
       PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ
       FILES \"${_conveyor_deploy}/systemd/coordinator.env\"
             \"${_conveyor_deploy}/systemd/worker.env\"
             \"${_conveyor_deploy}/systemd/coordinator.yaml\")
" COMPONENT runtime)

# --- Monitoring ------------------------------------------------------------

install(DIRECTORY ${_conveyor_deploy}/grafana/
        DESTINATION ${CMAKE_INSTALL_DATADIR}/conveyor/grafana COMPONENT runtime)
# By glob, so rule files added later ship too; promtool's rule tests
# (*_test.yml) are for this repository's CI, not for a Prometheus server.
file(GLOB _conveyor_prometheus_files CONFIGURE_DEPENDS
     ${_conveyor_deploy}/prometheus/*.yml)
list(FILTER _conveyor_prometheus_files EXCLUDE REGEX "_test\\.yml$")
install(FILES ${_conveyor_prometheus_files}
        DESTINATION ${CMAKE_INSTALL_DATADIR}/conveyor/prometheus COMPONENT runtime)

# --- Shell completion ------------------------------------------------------

# Generated by the conveyorctl just built, so the scripts always match its
# command tree.
set(_conveyor_completion_dir ${PROJECT_BINARY_DIR}/completion)
add_custom_command(
  OUTPUT ${_conveyor_completion_dir}/conveyorctl
         ${_conveyor_completion_dir}/_conveyorctl
  COMMAND ${CMAKE_COMMAND} -DCONVEYORCTL=$<TARGET_FILE:conveyorctl>
          -DOUTPUT_DIR=${_conveyor_completion_dir}
          -P ${PROJECT_SOURCE_DIR}/cmake/ConveyorCompletion.cmake
  DEPENDS conveyorctl ${PROJECT_SOURCE_DIR}/cmake/ConveyorCompletion.cmake
  COMMENT "Generating conveyorctl's bash and zsh completion"
  VERBATIM)
add_custom_target(conveyor_completion ALL
  DEPENDS ${_conveyor_completion_dir}/conveyorctl
          ${_conveyor_completion_dir}/_conveyorctl)
install(FILES ${_conveyor_completion_dir}/conveyorctl
        DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions
        COMPONENT runtime)
install(FILES ${_conveyor_completion_dir}/_conveyorctl
        DESTINATION ${CMAKE_INSTALL_DATADIR}/zsh/vendor-completions
        COMPONENT runtime)

# --- Debian metadata -------------------------------------------------------

# The changelog names the package version; Debian wants it compressed with
# gzip -9n (no name or time stamp, so the package is reproducible).
configure_file(${_conveyor_deploy}/debian/changelog.in
               ${_conveyor_packaging}/changelog.Debian @ONLY)
find_program(CONVEYOR_GZIP gzip REQUIRED)
add_custom_command(
  OUTPUT ${_conveyor_packaging}/changelog.Debian.gz
  COMMAND ${CONVEYOR_GZIP} -9nkf ${_conveyor_packaging}/changelog.Debian
  DEPENDS ${_conveyor_packaging}/changelog.Debian
  VERBATIM)
add_custom_target(conveyor_package_metadata ALL
  DEPENDS ${_conveyor_packaging}/changelog.Debian.gz)

set(_conveyor_components runtime)
if(TARGET conveyor_cuda_plugin)
  list(APPEND _conveyor_components cuda)
endif()
foreach(component IN LISTS _conveyor_components)
  set(package conveyor)
  if(component STREQUAL "cuda")
    set(package conveyor-cuda)
  endif()
  install(FILES ${_conveyor_deploy}/debian/copyright
                ${_conveyor_packaging}/changelog.Debian.gz
          DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/${package}
          PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ
          COMPONENT ${component})
endforeach()

# Maintainer scripts: CPack copies CONTROL_EXTRA files into the control
# archive as they are, so their modes must be right in the build tree.
foreach(script postinst postrm)
  file(COPY ${_conveyor_deploy}/debian/${script}
       DESTINATION ${_conveyor_packaging}
       FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE
                        GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
endforeach()
file(COPY ${_conveyor_deploy}/debian/conffiles
     DESTINATION ${_conveyor_packaging}
     FILE_PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
# Copied when CMake configures, so an edit must make it configure again.
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
  ${_conveyor_deploy}/debian/postinst ${_conveyor_deploy}/debian/postrm
  ${_conveyor_deploy}/debian/conffiles)

# --- CPack -----------------------------------------------------------------

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME conveyor)
set(CPACK_PACKAGE_VENDOR "Conveyor")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "${CONVEYOR_PACKAGE_MAINTAINER}")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "${PROJECT_DESCRIPTION}")
# The packages are for /usr; the daemons' conffiles and units assume it.
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)

set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL ${_conveyor_components})
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_RELEASE ${CONVEYOR_DEB_REVISION})
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${CONVEYOR_PACKAGE_MAINTAINER}")
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_COMPRESSION_TYPE xz)
# Depends from the libraries the binaries link (dpkg-shlibdeps). CPack runs
# it with --ignore-missing-info, so libraries no Debian package owns (CUDA
# under /usr/local/cuda) add no dependency instead of failing the build.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)

set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME conveyor)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_CONTROL_EXTRA
    ${_conveyor_packaging}/conffiles
    ${_conveyor_packaging}/postinst
    ${_conveyor_packaging}/postrm)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SUGGESTS "conveyor-cuda, prometheus, grafana")
# CPack puts CPACK_PACKAGE_DESCRIPTION_SUMMARY (the project's DESCRIPTION)
# first, as the synopsis of both packages; these are the long descriptions.
# Write them unindented, with an empty line between paragraphs: CPack indents
# each line by one space and turns empty lines into " ." (a line indented
# here would be shown preformatted).
set(CPACK_COMPONENT_RUNTIME_DESCRIPTION
    "Conveyor trains neural networks split into pipeline stages across
workers, one per device. This package holds the coordinator daemon (job
queue, planner, worker registry), the worker daemon, the conveyorctl
command-line interface, systemd units, default configuration in
/etc/conveyor, Grafana dashboards and Prometheus configuration in
/usr/share/conveyor, and bash and zsh completion.

Workers run CPU devices as they are; CUDA devices need conveyor-cuda.")

set(CPACK_DEBIAN_CUDA_PACKAGE_NAME conveyor-cuda)
# Only with the worker of the same build: the plugin's ABI is checked at load.
set(CPACK_DEBIAN_CUDA_PACKAGE_DEPENDS
    "conveyor (= ${PROJECT_VERSION}-${CONVEYOR_DEB_REVISION})")
set(CPACK_COMPONENT_CUDA_DESCRIPTION
    "The CUDA plugin of conveyor-worker, libconveyor_cuda.so: GPU kernels,
cuBLAS and NCCL for cuda:K devices.

It needs NVIDIA's cuBLAS (libcublas.so.${CUDAToolkit_VERSION_MAJOR}) and NCCL
(libnccl.so.2) on the dynamic loader's path, from NVIDIA's apt repository
or the CUDA toolkit, and an NVIDIA driver.")

include(CPack)
