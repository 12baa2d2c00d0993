# SPDX-License-Identifier: MIT
# tko_install_pkgconfig(<name>): configures cmake/<name>.pc.in into the build
# tree and installs it to <libdir>/pkgconfig.
#
# The .pc file is relocatable: its prefix is found from the file's own place
# (${pcfiledir}, which pkg-config and pkgconf both set), so an install with
# `cmake --install build --prefix DIR`, or a prefix moved after install,
# gives right paths. Only an absolute CMAKE_INSTALL_LIBDIR or
# CMAKE_INSTALL_INCLUDEDIR is written as it is.
function(tko_install_pkgconfig name)
  # From <prefix>/<libdir>/pkgconfig back up to <prefix>: "../.." for "lib".
  if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
    set(TKO_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
    set(TKO_PC_LIBDIR "${CMAKE_INSTALL_LIBDIR}")
  else()
    file(RELATIVE_PATH up "/tko/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/tko")
    string(REGEX REPLACE "/$" "" up "${up}")
    set(TKO_PC_PREFIX "\${pcfiledir}/${up}")
    set(TKO_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
  endif()
  if(IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
    set(TKO_PC_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}")
  else()
    set(TKO_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
  endif()
  configure_file(${PROJECT_SOURCE_DIR}/cmake/${name}.pc.in ${CMAKE_CURRENT_BINARY_DIR}/${name}.pc
                 @ONLY)
  install(FILES ${CMAKE_CURRENT_BINARY_DIR}/${name}.pc
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endfunction()
